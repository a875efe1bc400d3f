"""The numbers lmspec derives from a spec: parameters, memory, FLOPs, communication, serving.

Pure arithmetic on the typed spec; imports no torch, so compiling stays fast anywhere.
"""
