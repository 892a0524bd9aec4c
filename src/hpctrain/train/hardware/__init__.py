"""Precision and hardware: the system plan (device, precision, TF32, channels_last, compile), mixed
precision and loss scaling, float8 layers, and the model FLOPs utilisation."""
