"""Model: VITS as trained here, on top of transformers' `VitsModel`.

The training forward (posterior encoder, flow, alignment search and its kernels, duration and KL
terms), the discriminator, the loss functions, spectrograms, speaker handling, fresh initialisation and
the tiny test/demo model. May import: the root modules and `data` (speaker maps, the demo alphabet);
never `training`.
"""
