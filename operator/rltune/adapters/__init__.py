"""Framework adapters: canonical knobs -> a framework's own configuration.

Today only the rendering of a winner's knobs as override strings (`render.py`); the per-framework
adapters (verl, OpenRLHF: their config loaders, launch commands and log parsing) come later. Pure:
no Kubernetes, so the lifecycle can render the winner for the status.
"""
