"""A ``Plan`` to jobs and back: launch, admission, quotas, intents, local runs and cell status."""
