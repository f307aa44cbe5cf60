"""IR + layout plan -> GLSL kernels, a static pass schedule and the rendered bundle.

Nothing here imports torch or onnx.
"""
