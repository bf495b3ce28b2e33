"""Object storage: the S3-compatible bucket that holds checkpoints and uploaded data sets."""
