"""One router process: its lifecycle (listeners and pools started in order, served until the drain
ends), the terminating signals, the drain sequence carried out, the admin listener and its
endpoints, the model server's health polled, process tuning."""
