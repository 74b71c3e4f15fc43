"""End-to-end recipes: `python -m recipes.<name> [--workdir DIR] [--quick]` (see docs/recipes.md).

vision, learned_augmentation, learned_preprocessing, audio_synthesis, hf_finetune, crepe_finetune, text_lm.
"""
