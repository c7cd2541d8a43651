//! The reference CSI controller over its socket, in front of a real leader on loopback: what
//! CSI tooling sees, and what it leaves on the worker, in its records and in the credentials
//! directory.

// Helpers outside `#[test]` functions panic on failure on purpose, as the tests do.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::*;
use replicated_contract::context::{VolumeContext, VolumeMode};
use tak_os_worker::controller::{ControllerService, ControllerSettings, CredentialFiles};
use tonic::Code;
use tonic::transport::Channel;
use worker::testing::{Pki, leader};
use worker::{Server, Timings};

const TOKEN: &str = "controller-test-token";
const NAMESPACE: &str = "tak-os-system";
const GROUP: [&str; 2] = ["https://127.0.0.1:7443", "https://127.0.0.1:7444"];

struct Harness {
    dir: tempfile::TempDir,
    server: Option<Server>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    serving: Option<tokio::task::JoinHandle<Result<(), csi_proto::Error>>>,
    controller: ControllerClient<Channel>,
    identity: IdentityClient<Channel>,
}

impl Harness {
    async fn start() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate("controller").unwrap();
        for (name, text) in [
            ("ca.pem", &pki.ca_pem),
            ("client.pem", &pki.client_pem),
            ("client.key", &pki.client_key),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        std::fs::write(
            dir.path().join("tokens"),
            format!("# rotation\n{TOKEN}\nold\n"),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("credentials")).unwrap();
        let state = dir.path().join("state");
        let server = leader(&pki, &state, &[], TOKEN, Timings::default())
            .await
            .unwrap();
        let settings = ControllerSettings {
            endpoint: csi_proto::UnixEndpoint::from_path(dir.path().join("csi.sock")).unwrap(),
            driver_name: "csi.replicated.tak-os.org".to_owned(),
            group_endpoints: GROUP.map(str::to_owned).to_vec(),
            credential_namespace: Some(NAMESPACE.to_owned()),
            credentials: Some(CredentialFiles {
                dir: dir.path().join("credentials"),
                ca: dir.path().join("ca.pem"),
                cert: dir.path().join("client.pem"),
                key: dir.path().join("client.key"),
            }),
        };
        let socket = settings.endpoint.path().to_owned();
        let service =
            ControllerService::new(server.admin(), settings, &state, dir.path().join("tokens"))
                .unwrap();
        let listener = csi_proto::bind_unix(&socket).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(csi_proto::serve_on(listener, service.router(), async {
            let _ = stopped.await;
        }));
        let channel = csi_proto::connect_unix(&socket).await.unwrap();
        Harness {
            dir,
            server: Some(server),
            stop: Some(stop),
            serving: Some(serving),
            controller: ControllerClient::new(channel.clone()),
            identity: IdentityClient::new(channel),
        }
    }

    fn path(&self, rest: &str) -> PathBuf {
        self.dir.path().join(rest)
    }

    fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    async fn create(&mut self, request: CreateVolumeRequest) -> Result<Volume, tonic::Status> {
        let response = self.controller.create_volume(request).await?;
        Ok(response.into_inner().volume.unwrap())
    }

    async fn delete(&mut self, volume_id: &str) -> Result<(), tonic::Status> {
        self.controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: volume_id.to_owned(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.serving.take().unwrap().await.unwrap().unwrap();
        self.server.take().unwrap().stop().await;
    }
}

fn capability(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn request(name: &str, access_mode: &str, mode: Mode) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(mode)],
        parameters: HashMap::from([
            ("accessMode".to_owned(), access_mode.to_owned()),
            ("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned()),
        ]),
        ..Default::default()
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn create_answers_the_nodes_contract_and_is_idempotent_on_the_name() {
    let mut h = Harness::start().await;
    let volume = h
        .create(request("pvc-1", "rwo", Mode::SingleNodeWriter))
        .await
        .unwrap();
    assert_eq!(volume.volume_id, "pvc-1");
    assert_eq!(volume.capacity_bytes, 1 << 30);
    assert!(volume.accessible_topology.is_empty());
    let context = VolumeContext::parse(&volume.volume_context, NAMESPACE).unwrap();
    assert_eq!(context.mode, VolumeMode::Rwo);
    assert_eq!(context.endpoint_urls, GROUP);
    let spec = h.server().admin().volume("pvc-1").unwrap();
    assert_eq!(spec.volume_generation, context.generation);
    assert_eq!(spec.access_mode, worker::AccessMode::Rwo);

    // The credentials are where the node's directory source reads them, with the first token.
    let credentials = h.path("credentials/pvc-1");
    assert_eq!(
        files_in(&credentials),
        ["ca.crt", "tls.crt", "tls.key", "token"]
    );
    assert_eq!(
        std::fs::read_to_string(credentials.join("token")).unwrap(),
        TOKEN
    );

    // The same request again: the same volume, the same generation.
    let again = h
        .create(request("pvc-1", "rwo", Mode::SingleNodeMultiWriter))
        .await
        .unwrap();
    assert_eq!(again, volume);

    // The same name asking for something else.
    let other_mode = h
        .create(request("pvc-1", "rwx", Mode::MultiNodeMultiWriter))
        .await
        .unwrap_err();
    assert_eq!(other_mode.code(), Code::AlreadyExists, "{other_mode:?}");
    assert!(other_mode.message().contains("exists as an rwo volume"));
    let mut smaller = request("pvc-1", "rwo", Mode::SingleNodeWriter);
    smaller.capacity_range = Some(CapacityRange {
        required_bytes: 1,
        limit_bytes: 1 << 20,
    });
    let smaller = h.create(smaller).await.unwrap_err();
    assert_eq!(smaller.code(), Code::AlreadyExists, "{smaller:?}");
    assert!(smaller.message().contains("outside the requested range"));
    h.stop().await;
}

#[tokio::test]
async fn requests_the_node_could_never_serve_are_refused_before_anything_is_made() {
    let mut h = Harness::start().await;
    let mut no_name = request("", "rwx", Mode::MultiNodeMultiWriter);
    no_name.name.clear();
    let mut no_caps = request("pvc-a", "rwx", Mode::MultiNodeMultiWriter);
    no_caps.volume_capabilities.clear();
    let mut secrets = request("pvc-b", "rwx", Mode::MultiNodeMultiWriter);
    secrets
        .secrets
        .insert("password".to_owned(), "hunter2".to_owned());
    let mut block = request("pvc-c", "rwx", Mode::MultiNodeMultiWriter);
    block.volume_capabilities[0].access_type = Some(AccessType::Block(Default::default()));
    let mut inverted = request("pvc-d", "rwx", Mode::MultiNodeMultiWriter);
    inverted.capacity_range = Some(CapacityRange {
        required_bytes: 10,
        limit_bytes: 5,
    });
    let mut typo = request("pvc-e", "rwx", Mode::MultiNodeMultiWriter);
    typo.parameters
        .insert("acessMode".to_owned(), "rwo".to_owned());
    let cases = [
        (no_name, "name is required"),
        (
            request("pvc/../x", "rwx", Mode::MultiNodeMultiWriter),
            "cannot be a volume ID",
        ),
        (no_caps, "volume_capabilities are required"),
        (secrets, "secrets are not accepted"),
        (block, "block access"),
        (inverted, "below required_bytes"),
        (typo, "\"acessMode\" is unknown"),
        (
            request("pvc-f", "RWO", Mode::SingleNodeWriter),
            "\"RWO\" is invalid",
        ),
        (
            request("pvc-g", "rwo", Mode::SingleNodeSingleWriter),
            "SINGLE_NODE_SINGLE_WRITER",
        ),
        (
            request("pvc-h", "rwo", Mode::MultiNodeMultiWriter),
            "exceeds the volume's capabilities",
        ),
        (
            request("pvc-i", "rwx", Mode::SingleNodeWriter),
            "exceeds the volume's capabilities",
        ),
    ];
    for (req, expected) in cases {
        let name = req.name.clone();
        let error = h.create(req).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{name}: {error:?}");
        assert!(error.message().contains(expected), "{name}: {error:?}");
        assert!(!error.message().contains("hunter2"), "{name}: {error:?}");
    }
    assert!(files_in(&h.path("credentials")).is_empty());
    assert!(files_in(&h.path("state/controller")).is_empty());
    h.stop().await;
}

#[tokio::test]
async fn delete_removes_the_volume_its_record_and_credentials_and_is_idempotent() {
    let mut h = Harness::start().await;
    let first = h
        .create(request("pvc-1", "rwx", Mode::MultiNodeMultiWriter))
        .await
        .unwrap();
    h.delete("pvc-1").await.unwrap();
    assert!(h.server().admin().volume("pvc-1").is_none());
    assert!(files_in(&h.path("credentials")).is_empty());
    assert!(files_in(&h.path("state/controller")).is_empty());
    h.delete("pvc-1").await.unwrap();
    h.delete("never-made").await.unwrap();
    h.delete("not/an/id").await.unwrap();
    let missing = h.delete("").await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);

    // The name reused: a new volume with a larger generation.
    let second = h
        .create(request("pvc-1", "rwx", Mode::MultiNodeReaderOnly))
        .await
        .unwrap();
    let generation = |v: &Volume| {
        VolumeContext::parse(&v.volume_context, NAMESPACE)
            .unwrap()
            .generation
    };
    assert!(generation(&second) > generation(&first));
    h.stop().await;
}

#[tokio::test]
async fn a_crash_between_the_steps_is_finished_or_refused_never_a_reused_generation() {
    let mut h = Harness::start().await;
    // A volume on the worker that this controller never recorded (a delete that crashed after
    // dropping the record, or an admin call): refused, and a delete clears it.
    h.server()
        .admin()
        .create_volume(&worker::testing::volume(
            "pvc-foreign",
            worker::AccessMode::Rwx,
        ))
        .unwrap();
    let foreign = h
        .create(request("pvc-foreign", "rwx", Mode::MultiNodeMultiWriter))
        .await
        .unwrap_err();
    assert_eq!(foreign.code(), Code::AlreadyExists, "{foreign:?}");
    assert!(foreign.message().contains("did not create it"));
    h.delete("pvc-foreign").await.unwrap();
    assert!(h.server().admin().volume("pvc-foreign").is_none());

    // A record without a volume (a create that crashed after recording): the retry finishes
    // it with the recorded generation.
    let records = tak_os_worker::controller::Records::open(&h.path("state")).unwrap();
    records
        .put(&tak_os_worker::controller::Record {
            volume_id: "pvc-half".to_owned(),
            generation: 42,
            mode: VolumeMode::Rwo,
            capacity_bytes: 1 << 30,
        })
        .unwrap();
    let volume = h
        .create(request("pvc-half", "rwo", Mode::SingleNodeWriter))
        .await
        .unwrap();
    let context = VolumeContext::parse(&volume.volume_context, NAMESPACE).unwrap();
    assert_eq!(context.generation, 42);
    assert_eq!(
        h.server()
            .admin()
            .volume("pvc-half")
            .unwrap()
            .volume_generation,
        42
    );
    h.stop().await;
}

#[tokio::test]
async fn validate_confirms_only_what_the_volumes_mode_accepts() {
    let mut h = Harness::start().await;
    h.create(request("pvc-1", "rwo", Mode::SingleNodeWriter))
        .await
        .unwrap();
    let validate = |volume_id: &str, modes: &[Mode], parameters: &[(&str, &str)]| {
        ValidateVolumeCapabilitiesRequest {
            volume_id: volume_id.to_owned(),
            volume_capabilities: modes.iter().map(|m| capability(*m)).collect(),
            parameters: parameters
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        }
    };
    let check = |req| {
        let mut client = h.controller.clone();
        async move { client.validate_volume_capabilities(req).await }
    };
    let ok = check(validate(
        "pvc-1",
        &[Mode::SingleNodeWriter, Mode::SingleNodeMultiWriter],
        &[("accessMode", "rwo")],
    ))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(ok.confirmed.unwrap().volume_capabilities.len(), 2);
    for (req, expected) in [
        (
            validate("pvc-1", &[Mode::MultiNodeMultiWriter], &[]),
            "exceeds the volume's capabilities",
        ),
        (
            validate("pvc-1", &[Mode::SingleNodeWriter], &[("accessMode", "rwx")]),
            "the volume is rwo",
        ),
    ] {
        let refused = check(req).await.unwrap().into_inner();
        assert!(refused.confirmed.is_none());
        assert!(refused.message.contains(expected), "{}", refused.message);
    }
    let unknown = check(validate("pvc-2", &[Mode::SingleNodeWriter], &[]))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let empty = check(validate("pvc-1", &[], &[])).await.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    h.stop().await;
}

#[tokio::test]
async fn identity_and_capabilities_name_a_controller_without_topology() {
    let mut h = Harness::start().await;
    let info = h
        .identity
        .get_plugin_info(GetPluginInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.replicated.tak-os.org");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let plugin = h
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plugin.capabilities.len(), 1, "{plugin:?}");
    let probe = h.identity.probe(ProbeRequest::default()).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));

    use controller_service_capability::rpc::Type;
    let caps = h
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let types: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type)
        .map(|controller_service_capability::Type::Rpc(rpc)| rpc.r#type)
        .collect();
    assert_eq!(
        types,
        [
            Type::CreateDeleteVolume as i32,
            Type::SingleNodeMultiWriter as i32
        ]
    );
    let unsupported = h
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(unsupported.code(), Code::Unimplemented);
    tokio::time::timeout(Duration::from_secs(10), h.stop())
        .await
        .unwrap();
}
