"""texelfit: a PyTorch model in, one self-contained JavaScript file that trains it in the browser out.

In a notebook: `texelfit.export(model, example_inputs, out_dir, **build_options)` builds the bundle of an
nn.Module, and `texelfit.load_weights(model, path)` copies what the page trained back into it
(texelfit/notebook.py)."""
__version__ = "0.1.0"


def export(model, example_inputs, out_dir, **build_options):
    """texelfit/notebook.py: export (imported when called: `import texelfit` stays light)."""
    from texelfit.notebook import export as run

    return run(model, example_inputs, out_dir, **build_options)


def load_weights(model, path, example_inputs=None, **options):
    """texelfit/notebook.py: load_weights."""
    from texelfit.notebook import load_weights as run

    return run(model, path, example_inputs, **options)
