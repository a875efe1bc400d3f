"""DeepSpeed backend: a transformers model under ZeRO from ds_config.json."""
