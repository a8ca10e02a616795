"""Spider and prompts: loading the release, schema text, the prompt builder, augmentation and
the prepare stage's splits."""
