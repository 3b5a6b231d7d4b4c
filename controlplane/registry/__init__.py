"""The model registry: immutable, validated model versions pushed as tar.gz archives.

`archive` unpacks untrusted archives safely and builds them, `checks` validates the manifest and the
ONNX model inside, `service` stores versions (files under HOME/registry, rows in the database),
`api` and `cli` are its two front doors.
"""
