//! Wire compatibility of `proto/csi.proto`, which this project writes by hand: the messages the
//! drivers read and send encode to bytes derived by hand from the specification's field numbers
//! and types, and such bytes decode back to the same messages. Only fields a driver here relies
//! on are pinned; how prost encodes in general is prost's to test.
//!
//! A tag byte is `(field_number << 3) | wire_type`, with wire type 0 for varints (int32, int64,
//! bool, enums) and 2 for length-delimited data (strings, messages, map entries). A map field
//! is a repeated entry message with the key as field 1 and the value as field 2. Maps here
//! have one entry each, because the encoding order of several entries is not fixed.

use std::collections::HashMap;

use csi_proto::v1::{
    CapacityRange, CreateVolumeRequest, GetCapacityResponse, ListVolumesResponse,
    NodeGetCapabilitiesResponse, NodeGetInfoResponse, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodeServiceCapability, PluginCapability, ProbeResponse, Topology,
    TopologyRequirement, Volume, VolumeCapability, VolumeCondition, VolumeUsage,
    list_volumes_response, node_service_capability, plugin_capability, volume_capability,
    volume_usage,
};
use prost::Message;

fn map(key: &str, value: &str) -> HashMap<String, String> {
    HashMap::from([(key.to_owned(), value.to_owned())])
}

/// Encodes `message`, compares with `expected`, and decodes `expected` back.
fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(message: &M, expected: &[u8]) {
    let encoded = message.encode_to_vec();
    assert_eq!(hex(&encoded), hex(expected), "encoding of {message:?}");
    assert_eq!(
        &M::decode(expected).expect("decode"),
        message,
        "decoding of the expected bytes"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn zone_a() -> Topology {
    Topology {
        segments: map("zone", "a"),
    }
}

#[test]
fn create_volume_request_with_range_capabilities_and_topology() {
    let request = CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 2 << 20,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: "ext4".into(),
                    mount_flags: vec!["noatime".into()],
                    volume_mount_group: String::new(),
                },
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }],
        parameters: map("tier", "fast"),
        secrets: HashMap::new(),
        volume_content_source: None,
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![zone_a()],
            preferred: vec![zone_a()],
        }),
        mutable_parameters: map("iops", "3000"),
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // 1 name, LEN 5: "pvc-1"
        0x0a, 0x05, b'p', b'v', b'c', b'-', b'1',
        // 2 capacity_range, LEN 9
        0x12, 0x09,
            // 1 required_bytes, VARINT 1048576
            0x08, 0x80, 0x80, 0x40,
            // 2 limit_bytes, VARINT 2097152
            0x10, 0x80, 0x80, 0x80, 0x01,
        // 3 volume_capabilities[0], LEN 21
        0x1a, 0x15,
            // 2 mount (oneof access_type), LEN 15
            0x12, 0x0f,
                // 1 fs_type, LEN 4: "ext4"
                0x0a, 0x04, b'e', b'x', b't', b'4',
                // 2 mount_flags[0], LEN 7: "noatime"
                0x12, 0x07, b'n', b'o', b'a', b't', b'i', b'm', b'e',
            // 3 access_mode, LEN 2
            0x1a, 0x02,
                // 1 mode, VARINT 1 = SINGLE_NODE_WRITER
                0x08, 0x01,
        // 4 parameters entry, LEN 12
        0x22, 0x0c,
            // 1 key "tier", 2 value "fast"
            0x0a, 0x04, b't', b'i', b'e', b'r',
            0x12, 0x04, b'f', b'a', b's', b't',
        // 7 accessibility_requirements, LEN 26
        0x3a, 0x1a,
            // 1 requisite[0], LEN 11: Topology
            0x0a, 0x0b,
                // 1 segments entry, LEN 9: "zone" -> "a"
                0x0a, 0x09, 0x0a, 0x04, b'z', b'o', b'n', b'e', 0x12, 0x01, b'a',
            // 2 preferred[0], LEN 11: the same Topology
            0x12, 0x0b,
                0x0a, 0x09, 0x0a, 0x04, b'z', b'o', b'n', b'e', 0x12, 0x01, b'a',
        // 8 mutable_parameters entry, LEN 12: "iops" -> "3000"
        0x42, 0x0c,
            0x0a, 0x04, b'i', b'o', b'p', b's',
            0x12, 0x04, b'3', b'0', b'0', b'0',
    ];
    assert_wire(&request, expected);
}

#[test]
fn node_publish_volume_request_with_block_access_and_secrets() {
    let request = NodePublishVolumeRequest {
        volume_id: "vol-7".into(),
        publish_context: HashMap::new(),
        staging_target_path: "/stage".into(),
        target_path: "/target".into(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
            }),
        }),
        readonly: true,
        secrets: map("k", "v"),
        volume_context: map("a", "b"),
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // 1 volume_id, LEN 5: "vol-7"
        0x0a, 0x05, b'v', b'o', b'l', b'-', b'7',
        // 3 staging_target_path, LEN 6: "/stage"
        0x1a, 0x06, b'/', b's', b't', b'a', b'g', b'e',
        // 4 target_path, LEN 7: "/target"
        0x22, 0x07, b'/', b't', b'a', b'r', b'g', b'e', b't',
        // 5 volume_capability, LEN 6
        0x2a, 0x06,
            // 1 block (oneof access_type), LEN 0: an empty message is still sent
            0x0a, 0x00,
            // 3 access_mode, LEN 2: 1 mode, VARINT 5 = MULTI_NODE_MULTI_WRITER
            0x1a, 0x02, 0x08, 0x05,
        // 6 readonly, VARINT 1
        0x30, 0x01,
        // 7 secrets entry, LEN 6: "k" -> "v"
        0x3a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v',
        // 8 volume_context entry, LEN 6: "a" -> "b"
        0x42, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b',
    ];
    assert_wire(&request, expected);
}

#[test]
fn capability_oneofs_and_enum_values() {
    let rpc = |kind: node_service_capability::rpc::Type| NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc {
                r#type: kind as i32,
            },
        )),
    };
    let response = NodeGetCapabilitiesResponse {
        capabilities: vec![
            rpc(node_service_capability::rpc::Type::StageUnstageVolume),
            rpc(node_service_capability::rpc::Type::VolumeCondition),
            rpc(node_service_capability::rpc::Type::VolumeMountGroup),
        ],
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // 1 capabilities[0], LEN 4: 1 rpc, LEN 2: 1 type, VARINT 1 = STAGE_UNSTAGE_VOLUME
        0x0a, 0x04, 0x0a, 0x02, 0x08, 0x01,
        // 1 capabilities[1]: type 4 = VOLUME_CONDITION
        0x0a, 0x04, 0x0a, 0x02, 0x08, 0x04,
        // 1 capabilities[2]: type 6 = VOLUME_MOUNT_GROUP
        0x0a, 0x04, 0x0a, 0x02, 0x08, 0x06,
    ];
    assert_wire(&response, expected);

    let service = |kind: plugin_capability::service::Type| PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service {
                r#type: kind as i32,
            },
        )),
    };
    // 1 service (oneof type), LEN 2: 1 type, VARINT 1 = CONTROLLER_SERVICE
    assert_wire(
        &service(plugin_capability::service::Type::ControllerService),
        &[0x0a, 0x02, 0x08, 0x01],
    );
    // VARINT 2 = VOLUME_ACCESSIBILITY_CONSTRAINTS
    assert_wire(
        &service(plugin_capability::service::Type::VolumeAccessibilityConstraints),
        &[0x0a, 0x02, 0x08, 0x02],
    );
}

#[test]
fn probe_readiness_uses_the_bool_wrapper() {
    // 1 ready, LEN 2: a google.protobuf.BoolValue, 1 value, VARINT 1.
    assert_wire(
        &ProbeResponse { ready: Some(true) },
        &[0x0a, 0x02, 0x08, 0x01],
    );
}

#[test]
fn get_capacity_response_with_the_int64_wrapper() {
    let response = GetCapacityResponse {
        available_capacity: 10 << 30,
        maximum_volume_size: Some(1 << 30),
        minimum_volume_size: None,
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // 1 available_capacity, VARINT 10737418240
        0x08, 0x80, 0x80, 0x80, 0x80, 0x28,
        // 2 maximum_volume_size, LEN 6: Int64Value 1 value, VARINT 1073741824
        0x12, 0x06, 0x08, 0x80, 0x80, 0x80, 0x80, 0x04,
    ];
    assert_wire(&response, expected);
}

#[test]
fn list_volumes_response_with_a_next_token() {
    let response = ListVolumesResponse {
        entries: vec![list_volumes_response::Entry {
            volume: Some(Volume {
                capacity_bytes: 4096,
                volume_id: "v".into(),
                volume_context: HashMap::new(),
                content_source: None,
                accessible_topology: vec![zone_a()],
            }),
            status: None,
        }],
        next_token: "t".into(),
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // 1 entries[0], LEN 21
        0x0a, 0x15,
            // 1 volume, LEN 19
            0x0a, 0x13,
                // 1 capacity_bytes, VARINT 4096
                0x08, 0x80, 0x20,
                // 2 volume_id, LEN 1: "v"
                0x12, 0x01, b'v',
                // 5 accessible_topology[0], LEN 11: segments "zone" -> "a"
                0x2a, 0x0b, 0x0a, 0x09, 0x0a, 0x04, b'z', b'o', b'n', b'e', 0x12, 0x01, b'a',
        // 2 next_token, LEN 1: "t"
        0x12, 0x01, b't',
    ];
    assert_wire(&response, expected);
}

#[test]
fn node_get_info_response_with_topology() {
    let info = NodeGetInfoResponse {
        node_id: "n".into(),
        max_volumes_per_node: 16,
        accessible_topology: Some(zone_a()),
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // 1 node_id, LEN 1: "n"
        0x0a, 0x01, b'n',
        // 2 max_volumes_per_node, VARINT 16
        0x10, 0x10,
        // 3 accessible_topology, LEN 11: segments "zone" -> "a"
        0x1a, 0x0b, 0x0a, 0x09, 0x0a, 0x04, b'z', b'o', b'n', b'e', 0x12, 0x01, b'a',
    ];
    assert_wire(&info, expected);
}

#[test]
fn node_get_volume_stats_response_with_alpha_volume_condition() {
    let response = NodeGetVolumeStatsResponse {
        usage: vec![
            VolumeUsage {
                available: 3,
                total: 10,
                used: 7,
                unit: volume_usage::Unit::Bytes as i32,
            },
            VolumeUsage {
                available: 1,
                total: 2,
                used: 1,
                unit: volume_usage::Unit::Inodes as i32,
            },
        ],
        volume_condition: Some(VolumeCondition {
            abnormal: true,
            message: "gone".into(),
        }),
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // 1 usage[0], LEN 8: 1 available 3, 2 total 10, 3 used 7, 4 unit 1 = BYTES
        0x0a, 0x08, 0x08, 0x03, 0x10, 0x0a, 0x18, 0x07, 0x20, 0x01,
        // 1 usage[1], LEN 8: available 1, total 2, used 1, unit 2 = INODES
        0x0a, 0x08, 0x08, 0x01, 0x10, 0x02, 0x18, 0x01, 0x20, 0x02,
        // 2 volume_condition (alpha), LEN 8
        0x12, 0x08,
            // 1 abnormal, VARINT 1
            0x08, 0x01,
            // 2 message, LEN 4: "gone"
            0x12, 0x04, b'g', b'o', b'n', b'e',
    ];
    assert_wire(&response, expected);
}
