"""Python side of texelfit: load, export, simplify, convert to the IR, plan the layout."""
