"""The public Python API (`DartModel`) and the command lines built on it."""
