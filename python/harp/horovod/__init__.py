"""harp.horovod: Horovod's API on HARP, for Horovod scripts that should keep running.

    import harp.horovod.torch as hvd      # instead of: import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(hvd.rank())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16, backward_passes_per_step=2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

Horovod's last release (0.28.1, 2023) does not build against current torch; this
package gives its commonly used torch surface on a HARP communicator, with the
same names, arguments and results. Launch with anything harp.init() understands
(harp-run -np N, torchrun, mpirun, srun; `horovodrun -np N python train.py`
becomes `harp-run -np N python train.py`).

What is here (harp.horovod.torch): init/shutdown/is_initialized, rank, size,
local_rank, local_size, cross_rank, cross_size; allreduce, allreduce_, and their
_async forms with synchronize/poll; grouped_allreduce (fused into one HARP
allreduce per dtype); allgather (first dimensions may differ between ranks),
broadcast, broadcast_, alltoall (with splits), barrier; broadcast_object,
allgather_object, broadcast_parameters, broadcast_optimizer_state;
DistributedOptimizer (gradient hooks start asynchronous allreduces as gradients
become ready; backward_passes_per_step, op, gradient_predivide_factor,
compression, synchronize / skip_synchronize); Compression.none / fp16; ops
Average, Sum, Min, Max, Product; join() for ranks with fewer batches (start
every rank with hvd.init(join=True): each collective then carries a small
control allreduce; harp/horovod/torch/_join.py has the semantics and cost).

Elastic training (hvd.elastic): run, State, ObjectState, TorchState (commit,
restore, sync, reset callbacks), HostsUpdatedInterrupt; a lost worker is
survived by shrinking to the others (harp/horovod/torch/elastic.py says what
differs from Horovod: workers are lost, not added, during run()).

What is not (each raises NotImplementedError naming it): Adasum and process
sets other than the global one. Tensors must be on the
CPU (HARP's torch backend serves CUDA tensors; this front does not yet).

Threading: like Horovod, one communicator per process, shared by every call;
asynchronous operations complete in the order they were started.
"""
