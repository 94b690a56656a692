"""resolute master: REST API, storage and (later) the scheduler."""
