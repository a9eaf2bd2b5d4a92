"""Image and box analysis of visible + infrared pairs, shared by the
training hooks (:mod:`mmsafe.engine.hooks.first_batch_checks`) and the
dataset checker (``mmsafe-check-dataset``): pair alignment, per-box
offsets (box matching and infrared presence) and the pictures that show
them.

It works on arrays and boxes only: nothing here imports the training
engine or the command-line tools.
"""
