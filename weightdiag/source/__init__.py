"""Where weights come from: local files, the Hugging Face Hub, other checkpoint formats."""
