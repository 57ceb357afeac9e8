"""Running one sampler for many workers: the sampler hosted as a Ray actor, with exact leases.

``envsched.distributed`` exports the public names of :mod:`envsched.distributed.ray_host`; Ray itself is
imported only when a host is launched or a :class:`RemoteSampler` calls it (``pip install 'envsched[ray]'``).
"""

from envsched.distributed.ray_host import (
    Lease,
    LeaseExpiredError,
    LeaseUnconfirmedError,
    LocalClient,
    RemoteSampler,
    SamplerHost,
    UnknownLeaseError,
    UpdateBatchError,
    launch_sampler,
    release_name,
)

__all__ = ["Lease", "LeaseExpiredError", "LeaseUnconfirmedError", "LocalClient", "RemoteSampler", "SamplerHost",
           "UnknownLeaseError", "UpdateBatchError", "launch_sampler", "release_name"]
