// ---- no column-blocked conv (rendered in place of cpu_columns.js where no kernel is column-blocked) ---------

// (no pass of this bundle is column-blocked: the generic kernel's function runs as it is)
const cpuColumns = (generic) => generic;
