//! The server's use cases, between the gRPC handlers and what they drive:
//! publishing a bundle (`publish.rs`), starting a rollout (`start.rs`, its
//! policy checked and resolved by `lks_rollout::Policy`), an operator verb on one
//! (`verb.rs`), enrolling a node (`enrol.rs`), renewing its certificate
//! (`renew.rs`) and issuing the certificates of its bundles (`issue.rs`),
//! building the desired state a node's stream sends (`desired.rs`) and
//! checking and storing what its agent reports on it (`session.rs`),
//! creating and changing a cluster (`cluster.rs`), issuing a bootstrap
//! token (`token.rs`), reading the event log and the audit trail
//! (`logs.rs`), deleting, retrying, holding and releasing a node
//! (`node.rs`), reading and deleting a published bundle version
//! (`bundle.rs`), what a node may have of the server's blobs and from
//! where (`blob.rs`), publishing a cluster's signed releases and trust roots
//! (`release.rs`), coordinated reboots' policy, runs and status
//! (`reboot.rs`), release plans: creating one, its groups expanded, and
//! the verbs on it (`plan.rs`), and what requests share: the label rule
//! (`labels.rs`) and a node's event record (`event.rs`). Each operation takes its
//! request decoded into plain Rust and answers plain Rust or an
//! [`OpError`]; none names tonic (the one generated type here is the
//! desired state, built in its wire form because it goes out as stored),
//! so an operation reads as its steps and a test can call it without a
//! server.
//!
//! It sits below `api` (whose handlers decode a request, call an
//! operation and encode its answer, and turn an [`OpError`] into a status
//! in one place) and above the store, the blob store, the PKI, the
//! metrics and the rollout modules it drives. It never names `api`.

pub mod blob;
pub mod bundle;
pub mod certs;
pub mod cluster;
pub mod desired;
pub mod enrol;
pub mod event;
#[cfg(test)]
pub(crate) mod fixture;
pub mod issue;
pub mod labels;
pub mod logs;
pub mod node;
pub mod plan;
pub mod publish;
pub mod reboot;
pub mod release;
pub mod renew;
pub mod session;
pub mod start;
pub mod token;
pub mod verb;

use crate::controller::CommandError;
use crate::store::StoreError;
use lks_blobs::BlobError;

pub use blob::FetchError;
pub use bundle::BundleError;
pub use certs::CertsError;
pub use cluster::ClusterError;
pub use enrol::EnrolError;
pub use issue::IssueError;
pub use labels::LabelsError;
pub use logs::LogsError;
pub use node::NodeError;
pub use plan::PlanError;
pub use publish::PublishError;
pub use reboot::RebootError;
pub use release::ReleaseError;
pub use renew::RenewError;
pub use session::ReportError;
pub use start::StartError;
pub use token::TokenError;
pub use verb::VerbRefusal;

/// What kind of refusal or failure an error is: how the edge answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The request is wrong; retrying it unchanged fails the same way.
    Invalid,
    /// What the request would create exists already.
    AlreadyExists,
    /// What the request names does not exist.
    NotFound,
    /// The request is sound but the system is not in a state to carry it
    /// out; the message says what to change first.
    FailedPrecondition,
    /// The request asks for more than there is (a range past the end).
    OutOfRange,
    /// The caller asked too often; it may ask again later.
    ResourceExhausted,
    /// Try again later.
    Unavailable,
    /// The caller's credentials (a bootstrap token) are not accepted.
    Unauthenticated,
    /// The caller is who it says, but may not have what it asks for.
    PermissionDenied,
    /// The server failed; the message says where.
    Internal,
}

/// Declares [`OpError`]: a variant per operation's refusal, each made
/// `From` its error type and answered by that type's own `kind()`
/// ([`OpError::kind`]), then the failures of what the operations drive.
/// A refusal is one line here.
macro_rules! op_error {
    ($($refusal:ident($error:ty)),* $(,)?) => {
        /// Why an operation failed.
        #[derive(Debug, thiserror::Error)]
        pub enum OpError {
            $(
                #[error(transparent)]
                $refusal(#[from] $error),
            )*
            /// The rollout controller did not carry out a command.
            #[error(transparent)]
            Controller(CommandError),
            /// The store failed or refused.
            #[error(transparent)]
            Store(#[from] StoreError),
            /// The blob store failed for `what` (a file's target path;
            /// empty if the failure concerns no one file).
            #[error("{}", if what.is_empty() { source.to_string() } else { format!("{what}: {source}") })]
            Blob {
                what: String,
                #[source]
                source: BlobError,
            },
        }

        impl OpError {
            /// How the edge answers it, for the errors whose answer
            /// depends on their kind alone (not a store or blob store
            /// failure).
            pub fn kind(&self) -> Option<Kind> {
                match self {
                    $(OpError::$refusal(e) => Some(e.kind()),)*
                    OpError::Controller(e) => controller_kind(e),
                    OpError::Store(_) | OpError::Blob { .. } => None,
                }
            }
        }
    };
}

op_error! {
    Publish(PublishError),
    Start(StartError),
    Enrol(EnrolError),
    Cluster(ClusterError),
    Verb(VerbRefusal),
    Token(TokenError),
    Labels(LabelsError),
    Node(NodeError),
    Release(ReleaseError),
    Bundle(BundleError),
    Renew(RenewError),
    Issue(IssueError),
    Fetch(FetchError),
    Certs(CertsError),
    Report(ReportError),
    Logs(LogsError),
    Plan(PlanError),
    Reboot(RebootError),
}

impl From<CommandError> for OpError {
    /// A store failure is a store failure, whoever met it.
    fn from(e: CommandError) -> Self {
        match e {
            CommandError::Store(e) => OpError::Store(e),
            e => OpError::Controller(e),
        }
    }
}

/// How the edge answers a command the controller did not carry out;
/// `None` for a store failure (answered as every store failure is).
fn controller_kind(e: &CommandError) -> Option<Kind> {
    match e {
        CommandError::Gone => Some(Kind::Unavailable),
        CommandError::NoRollout { .. } => Some(Kind::NotFound),
        CommandError::Verb(_) => Some(Kind::FailedPrecondition),
        CommandError::Store(_) => None,
    }
}

impl OpError {
    /// A blob store failure concerning the file at `what`.
    pub fn blob(what: impl Into<String>, source: BlobError) -> Self {
        OpError::Blob {
            what: what.into(),
            source,
        }
    }
}
