"""Build tooling of the repository (not shipped in the wheel): the container image."""
