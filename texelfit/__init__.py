"""texelfit: a PyTorch model in, one self-contained JavaScript file that trains it in the browser out."""
__version__ = "0.1.0"
