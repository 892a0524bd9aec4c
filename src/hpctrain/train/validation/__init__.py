"""Evaluation on the validation set, and the evaluation model with its batch norms folded into the
convolutions."""
