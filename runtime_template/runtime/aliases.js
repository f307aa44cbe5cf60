// ---- tied parameters' other names (rendered only where the model has them: MODEL.aliases) -------------

// getWeights' object with a tied parameter also under its other state_dict keys (MODEL.aliases), as copies
function withAliases(weights) {
  for (const [alias, name] of Object.entries(MODEL.aliases)) weights[alias] = weights[name].slice();
  return weights;
}
