"""Reading the controller's own history back: incidents, live quarantine precision, detection and
repair times (``review``), and sweeping a policy's thresholds against recordings and scenarios
(``tune``)."""
