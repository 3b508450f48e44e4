//! innet's tools on the emulated fabric of `innet-lab`, each a binary of this crate:
//! `innet-demo` (the README's main job), `innet-bench` ([`bench`](mod@bench): innet against
//! OpenMPI as users run it and against the hosts' own algorithms, with reports and plots)
//! and `innet-campaign` ([`campaign`]: loss, churn, soak, vanishing groups, hostile
//! hosts). Beside them, what the tests share with the tools: [`attack`] (the frames a host
//! outside a job forges against it) and [`capture`] (tshark on a namespace's interfaces).
//! Everything needs root; what a run builds is torn down as `innet-lab` says.

pub mod attack;
pub mod bench;
pub mod campaign;
pub mod capture;
pub mod markdown;
