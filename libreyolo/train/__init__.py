"""Training: datasets and augmentation (``data``, ``augment``, ``shapes``), and the trainer.

Submodules are imported directly (``from libreyolo.train.data import DetectionDataset``) so that
``import libreyolo.train`` stays light.
"""
