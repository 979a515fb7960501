"""Fixit: fine-tuning data from a model's own mistakes and their corrections (build.py),
and LoRA fine-tuning on it with TRL + PEFT (train.py). See docs/FIXIT.md."""
