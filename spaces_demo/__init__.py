"""The Gradio fill-mask demo; ``app.py`` is also the ``app.py`` of Spaces created by ``hf-tpu deploy-space``."""
