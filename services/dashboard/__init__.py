"""The web dashboard: server-rendered pages over the same services as the JSON API."""
