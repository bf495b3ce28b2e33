"""Models named by their Hugging Face Hub id: config.json fetched once, cached, handed to the estimator."""
