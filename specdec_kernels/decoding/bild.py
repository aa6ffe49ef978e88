"""placeholder"""
from .engine import Strategy


class BildDecoder(Strategy):
    pass
