"""Every command the README and docs/*.md show, run as written (``test_commands.py``)."""
