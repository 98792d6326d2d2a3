"""Mechanisms the training loop calls: checkpoints, precision, seeding, schedules, logging."""
