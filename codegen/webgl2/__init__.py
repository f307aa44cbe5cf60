"""The WebGL2 backend's storage plan: where every tensor lives as RGBA float textures (layout.py: the channel-packed
texel layout, folding past the device's texture limit, the textures a schedule needs) and the blocking rules tuned
for the software GPU (blocking.py: several samples, positions or input slices a fragment, into several render
targets). prep/ ends with the IR; the packing rule that every backend shares is prep/packing.py. The CPU backend
runs on this plan today (its textures are Float32Arrays of the same texels: runtime/cpu.js)."""
