"""Model families: one folder per family (network + family adapter), registered by name in
:mod:`libreyolo.models.registry`; shared bases of the kinds of family beside them."""
