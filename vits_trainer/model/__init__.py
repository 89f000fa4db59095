"""Model: VITS as trained here, on top of transformers' `VitsModel`.

The training forward (posterior encoder, flow, alignment search and its kernels, duration and KL
terms, the duration predictor's spline), the discriminator, the loss functions, spectrograms, speaker handling, fresh initialisation,
the tiny test/demo model, and speaking from text with a saved model folder (synthesis.py).
May import: the root modules and `data` (speaker maps, the demo alphabet, the text encoder); never
`training`.
"""
