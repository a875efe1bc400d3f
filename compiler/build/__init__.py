"""The build directory as a contract: its file names, the atomic writer, and readers that trust only the manifest."""
