"""Celery workers: the same task functions the embedded default runs in process, on Redis queues."""
