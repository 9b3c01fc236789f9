"""What the controller does to one ModelService, pass by pass: the staged deletion, recycling, the
lifecycle rules and waking, each observe -> decide (pure, in :mod:`drain_router.decisions`) -> act."""
