//! The per-volume client: admission, the call policy, a transport and metrics together.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::Error;
use crate::config::Budgets;
use crate::config::later;
use crate::endpoint::EndpointSet;
use crate::metrics as names;
use crate::policy::{AttemptOutcome, CallPolicy, Finish, Step};
use crate::protocol::{
    AccessMode, Classified, MountEpoch, ProtocolError, RequestId, VolumeGeneration, classify_reply,
    decode_reply, encode_request,
};
use crate::transport::{Transport, TransportError};
use crate::v1;
use crate::v1::reply::Result as ReplyResult;
use crate::v1::request::Op;

/// What a [`Client`] needs to know about its volume.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The volume's ID.
    pub volume_id: String,
    /// The volume generation staged.
    pub volume_generation: VolumeGeneration,
    /// The access mode staged.
    pub access_mode: AccessMode,
    /// The worker endpoints staged.
    pub endpoints: EndpointSet,
    /// Call budgets and admission.
    pub budgets: Budgets,
}

struct Shared<T> {
    config: ClientConfig,
    endpoints: Arc<EndpointSet>,
    transport: T,
    slots: Semaphore,
    /// The endpoint that last answered: where the next call starts.
    preferred: AtomicUsize,
    /// The reply retention the workers last stated, in milliseconds; zero until one did.
    reply_retention_ms: AtomicU64,
}

/// A client for one volume's workers. Cheap to clone; clones share admission slots, the
/// transport (and its connections) and the endpoint that last answered.
///
/// A client made by [`with_epoch`](Client::with_epoch) stamps its mount epoch on every
/// request it prepares.
pub struct Client<T> {
    shared: Arc<Shared<T>>,
    epoch: Option<MountEpoch>,
}

impl<T> Clone for Client<T> {
    fn clone(&self) -> Self {
        Client {
            shared: Arc::clone(&self.shared),
            epoch: self.epoch,
        }
    }
}

impl<T> std::fmt::Debug for Client<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("volume_id", &self.shared.config.volume_id)
            .field("endpoints", &self.shared.endpoints)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// One logical call, encoded once: send it with [`Client::send`] as often as needed (after
/// an [`Error::Uncertain`], say) and every attempt carries the identical bytes and request
/// ID. Its `Debug` output shows the body's length only: the body may hold file contents.
#[derive(Clone)]
pub struct PreparedCall {
    request_id: RequestId,
    op: &'static str,
    body: Bytes,
    prepared_at: Instant,
}

impl std::fmt::Debug for PreparedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCall")
            .field("request_id", &self.request_id)
            .field("op", &self.op)
            .field("body_bytes", &self.body.len())
            .field("prepared_at", &self.prepared_at)
            .finish()
    }
}

impl PreparedCall {
    /// The call's request ID.
    pub fn request_id(&self) -> RequestId {
        self.request_id
    }

    /// The operation's name.
    pub fn operation(&self) -> &'static str {
        self.op
    }

    /// The encoded request, as every attempt sends it.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// When the call was prepared: no attempt of it was sent earlier.
    pub fn prepared_at(&self) -> Instant {
        self.prepared_at
    }
}

impl<T: Transport> Client<T> {
    /// A client for the volume `config` describes, sending through `transport`.
    pub fn new(config: ClientConfig, transport: T) -> Self {
        let slots = Semaphore::new(config.budgets.max_in_flight.min(Semaphore::MAX_PERMITS));
        Client {
            shared: Arc::new(Shared {
                endpoints: Arc::new(config.endpoints.clone()),
                config,
                transport,
                slots,
                preferred: AtomicUsize::new(0),
                reply_retention_ms: AtomicU64::new(0),
            }),
            epoch: None,
        }
    }

    /// A client sharing this one's state that stamps `epoch` on its requests.
    pub fn with_epoch(&self, epoch: MountEpoch) -> Self {
        Client {
            shared: Arc::clone(&self.shared),
            epoch: Some(epoch),
        }
    }

    /// The mount epoch this client stamps, if any.
    pub fn epoch(&self) -> Option<MountEpoch> {
        self.epoch
    }

    /// The client's configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.shared.config
    }

    /// The transport (to rotate credentials on an [`HttpsTransport`](crate::HttpsTransport),
    /// or to inspect a fake).
    pub fn transport(&self) -> &T {
        &self.shared.transport
    }

    /// The reply retention the workers last stated: how long a worker keeps the reply of a
    /// mutation it applied, so that a repeat of the call with the same request ID and bytes
    /// sent within it is answered from its cache instead of being applied again. `None` until
    /// a reply stated one.
    pub fn reply_retention(&self) -> Option<Duration> {
        match self.shared.reply_retention_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Encodes `op` as a new logical call with a fresh random request ID.
    pub fn prepare(&self, op: Op) -> Result<PreparedCall, Error> {
        self.prepare_with_id(RequestId::random()?, op)
    }

    /// Encodes `op` as a logical call with the given request ID. Re-preparing the same
    /// operation with the same ID gives the same bytes.
    pub fn prepare_with_id(&self, request_id: RequestId, op: Op) -> Result<PreparedCall, Error> {
        let config = &self.shared.config;
        let name = op.name();
        let data_len = op.data_len();
        if data_len > config.budgets.max_data_bytes {
            return Err(Error::InvalidRequest {
                volume_id: config.volume_id.clone(),
                op: name,
                source: ProtocolError::DataTooLarge {
                    len: data_len,
                    max: config.budgets.max_data_bytes,
                },
            });
        }
        let request = v1::Request {
            volume_id: config.volume_id.clone(),
            volume_generation: config.volume_generation.0,
            request_id: request_id.0.to_vec(),
            mount_epoch: self.epoch.map(|e| e.0.to_vec()).unwrap_or_default(),
            access_mode: config.access_mode.into(),
            op: Some(op),
        };
        Ok(PreparedCall {
            request_id,
            op: name,
            body: encode_request(&request),
            prepared_at: Instant::now(),
        })
    }

    /// Prepares and sends `op` as one logical call within the call budget.
    pub async fn call(&self, op: Op) -> Result<ReplyResult, Error> {
        let call = self.prepare(op)?;
        self.send(&call).await
    }

    /// Sends a prepared call within one call budget from now (admission included).
    pub async fn send(&self, call: &PreparedCall) -> Result<ReplyResult, Error> {
        self.send_until(call, later(Instant::now(), self.shared.config.budgets.call))
            .await
    }

    /// Sends a prepared call that must end by `deadline` or within one call budget,
    /// whichever comes first.
    pub async fn send_until(
        &self,
        call: &PreparedCall,
        deadline: Instant,
    ) -> Result<ReplyResult, Error> {
        let started = Instant::now();
        let deadline = deadline.min(later(started, self.shared.config.budgets.call));
        let result = self.run(call, started, deadline).await;
        let outcome = outcome_label(&result);
        metrics::counter!(names::CALLS, "operation" => call.op, "outcome" => outcome).increment(1);
        metrics::histogram!(names::CALL_SECONDS, "operation" => call.op)
            .record(started.elapsed().as_secs_f64());
        if matches!(result, Err(Error::Uncertain { .. })) {
            metrics::counter!(names::UNCERTAIN, "operation" => call.op).increment(1);
        }
        result
    }

    async fn run(
        &self,
        call: &PreparedCall,
        started: Instant,
        deadline: Instant,
    ) -> Result<ReplyResult, Error> {
        let shared = &*self.shared;
        let volume_id = || shared.config.volume_id.clone();
        let op = call.op;

        let admitted = tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline),
            shared.slots.acquire(),
        )
        .await;
        let _slot = match admitted {
            Ok(Ok(slot)) => slot,
            // The semaphore is never closed; a closed one would mean no slot ever again.
            Ok(Err(_)) | Err(_) => {
                return Err(Error::Busy {
                    volume_id: volume_id(),
                    op,
                });
            }
        };

        let seed = u64::from_le_bytes(call.request_id.0[..8].try_into().unwrap_or([0; 8]));
        let mut policy = CallPolicy::new(
            Arc::clone(&shared.endpoints),
            &shared.config.budgets,
            shared.preferred.load(Ordering::Relaxed),
            started,
            deadline,
            seed,
        );
        let mut answer: Option<Result<ReplyResult, Error>> = None;
        let mut previous_endpoint: Option<usize> = None;
        loop {
            match policy.poll(Instant::now()) {
                Step::Wait(at) => {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                }
                Step::Send {
                    endpoint,
                    deadline: attempt_deadline,
                } => {
                    if policy.attempts() > 1 {
                        metrics::counter!(names::RETRIES, "operation" => op).increment(1);
                    }
                    if previous_endpoint.is_some_and(|previous| previous != endpoint) {
                        metrics::counter!(names::ENDPOINT_CHANGES, "operation" => op).increment(1);
                    }
                    previous_endpoint = Some(endpoint);
                    let sent = tokio::time::timeout_at(
                        tokio::time::Instant::from_std(attempt_deadline),
                        shared.transport.send(
                            shared.endpoints.get(endpoint),
                            call.body.clone(),
                            attempt_deadline,
                        ),
                    )
                    .await
                    .unwrap_or(Err(TransportError::MaybeDelivered(
                        crate::policy::Failure::Timeout,
                    )));
                    let outcome = match sent {
                        Ok(body) => match self.interpret(call, body) {
                            Interpreted::Final(result) => {
                                shared.preferred.store(endpoint, Ordering::Relaxed);
                                answer = Some(result);
                                AttemptOutcome::Answered
                            }
                            Interpreted::Retry(outcome) => outcome,
                        },
                        Err(TransportError::NotDelivered(failure)) => {
                            AttemptOutcome::NotDelivered(failure)
                        }
                        Err(TransportError::MaybeDelivered(failure)) => {
                            AttemptOutcome::MaybeDelivered(failure)
                        }
                        Err(TransportError::Unauthorized {
                            credentials_changed,
                        }) => AttemptOutcome::Unauthorized {
                            credentials_changed,
                        },
                        Err(TransportError::Rejected { status }) => {
                            answer = Some(Err(Error::Rejected {
                                volume_id: volume_id(),
                                op,
                                status,
                            }));
                            AttemptOutcome::Answered
                        }
                    };
                    policy.record(Instant::now(), outcome);
                }
                Step::Finish(Finish::Answered) => {
                    return answer.unwrap_or_else(|| {
                        Err(Error::Uncertain {
                            volume_id: volume_id(),
                            op,
                            request_id: call.request_id,
                        })
                    });
                }
                Step::Finish(Finish::Uncertain) => {
                    return Err(Error::Uncertain {
                        volume_id: volume_id(),
                        op,
                        request_id: call.request_id,
                    });
                }
                Step::Finish(Finish::Unavailable { last }) => {
                    return Err(Error::Unavailable {
                        volume_id: volume_id(),
                        op,
                        last,
                    });
                }
                Step::Finish(Finish::Unauthorized) => {
                    return Err(Error::Unauthorized {
                        volume_id: volume_id(),
                        op,
                    });
                }
            }
        }
    }

    fn interpret(&self, call: &PreparedCall, body: Bytes) -> Interpreted {
        let classified = decode_reply(body).ok().and_then(|reply| {
            if reply.reply_retention_ms != 0 && reply.request_id == call.request_id.0 {
                self.shared
                    .reply_retention_ms
                    .store(reply.reply_retention_ms, Ordering::Relaxed);
            }
            classify_reply(reply, &call.request_id, call.op).ok()
        });
        match classified {
            // Whatever came back was not an answer to this request; the request itself may
            // well have been applied.
            None => Interpreted::Retry(AttemptOutcome::MaybeDelivered(
                crate::policy::Failure::BadReply,
            )),
            Some(Classified::Success(result)) => Interpreted::Final(Ok(result)),
            Some(Classified::Refused(refusal)) => Interpreted::Final(Err(Error::Refused {
                volume_id: self.shared.config.volume_id.clone(),
                op: call.op,
                refusal,
            })),
            Some(Classified::NotLeader { hint }) => {
                Interpreted::Retry(AttemptOutcome::NotLeader { hint })
            }
            Some(Classified::NoQuorum) => Interpreted::Retry(AttemptOutcome::NoQuorum),
            Some(Classified::Busy) => Interpreted::Retry(AttemptOutcome::WorkerBusy),
            Some(Classified::Uncertain) => Interpreted::Retry(AttemptOutcome::WorkerUncertain),
        }
    }
}

enum Interpreted {
    Final(Result<ReplyResult, Error>),
    Retry(AttemptOutcome),
}

fn outcome_label(result: &Result<ReplyResult, Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(error) => error_label(error),
    }
}

/// The bounded metric label of a failed call.
pub(crate) fn error_label(error: &Error) -> &'static str {
    match error {
        Error::Refused { .. } => "refused",
        Error::Uncertain { .. } => "uncertain",
        Error::Unavailable { .. } => "unavailable",
        Error::Unauthorized { .. } => "unauthorized",
        Error::Busy { .. } => "busy",
        Error::Rejected { .. } => "rejected",
        Error::UnexpectedReply { .. } | Error::InvalidRequest { .. } | Error::Random(_) => "error",
    }
}

#[cfg(test)]
mod debug_tests {
    #[test]
    fn a_prepared_call_never_shows_its_body() {
        let call = super::PreparedCall {
            request_id: crate::protocol::RequestId([7; 16]),
            op: "write",
            body: bytes::Bytes::from_static(b"secret file contents"),
            prepared_at: std::time::Instant::now(),
        };
        let shown = format!("{call:?}");
        assert!(
            !shown.contains("secret") && shown.contains("body_bytes: 20"),
            "{shown}"
        );
    }
}
