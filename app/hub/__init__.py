"""Model catalog and Hugging Face downloads (huggingface_hub)."""
