"""The serve stage: vLLM with the build's args, health-checked."""
