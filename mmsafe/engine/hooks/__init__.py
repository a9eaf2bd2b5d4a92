"""mmsafe hooks, one per file."""
