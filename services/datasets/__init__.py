"""Data sets: resumable uploads to object storage, the data set check as a background task, and the
report a plan can be sized from."""
