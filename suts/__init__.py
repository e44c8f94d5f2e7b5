"""Decoding strategies (systems under test) behind one small interface."""
