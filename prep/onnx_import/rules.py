"""Every import rule, in the one order in which they are tried (registry.py: for a node, those registered for
its op type and those for ANY, in this order; the first that returns True has converted it). The order matters
where several rules take one op type: the special cases (a 1-D conv's twin, constants, parameter views and
tables, lazy batch views, a bias of a matmul) come before the general rule of the op."""
from __future__ import annotations

from . import constants, conv, elementwise, linear, norm, pool_reduce, shape_ops, tables
from .registry import Registry

ORDER = (
    # a node rewritten for the rules after these (1-D as 2-D): they never convert one
    conv.twin_1d,
    conv.twin_per_channel,
    # constants and symbolic shape values; parameters read through views and at constant indices
    constants.constant,
    constants.expand_activation,
    constants.batch_constant,
    constants.uniform_batch_constant,
    constants.merged_batch_constant,
    constants.parameter_view,
    tables.table_gather,
    tables.table_view_shape,
    tables.table_added,
    tables.table_guard,
    tables.position_gather,
    constants.constant_fold,
    constants.equal_constant,
    constants.where_equal,
    constants.is_nan,
    constants.where_nan,
    constants.shape,
    shape_ops.batch_view,
    shape_ops.split_view,
    constants.cast_ids,
    constants.cast_bool,
    constants.where_boolean,
    tables.token_embedding,
    constants.shape_only,
    # layers
    linear.dropout_in_training,
    linear.identity,
    linear.gemm,
    linear.matmul_of_activations,
    linear.matmul_of_tokens,
    linear.matmul_dense,
    conv.conv,
    conv.conv_transpose,
    conv.batchnorm,
    elementwise.add_bias,
    elementwise.silu,
    elementwise.constant_on_lazy_view,
    elementwise.same_lazy_views,
    elementwise.pointwise_on_lazy_view,
    elementwise.on_merged_batch,
    norm.layernorm,
    norm.softmax_of_tokens,
    elementwise.elementwise,
    shape_ops.concat,
    shape_ops.resample_layer,
    shape_ops.per_sample_view,
    shape_ops.split,
    norm.softmax,
    pool_reduce.pool,
    pool_reduce.reduce,
    shape_ops.flatten_reshape,
)

REGISTRY = Registry(ORDER)
