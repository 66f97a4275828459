// RpcBackendOptions and TensorPipeRpcBackendOptions: what a backend is configured with.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/secret.hpp>
#include <tensorplay/device/device.hpp>
#include <tensorplay/device/device_map.hpp>
#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace tensorplay {

/// Options every backend understands. Polymorphic: an init handler checks the dynamic type
/// (dynamic_cast) of the options it is given. Not thread-safe: configure, then hand over.
struct TP_API RpcBackendOptions {
    /// Default timeout of an RPC in seconds; 0 means no timeout.
    double rpc_timeout = DEFAULT_RPC_TIMEOUT_SEC;
    /// How workers rendezvous: "env://", "tcp://host:port", "file://path".
    std::string init_method = std::string(DEFAULT_INIT_METHOD);
    /// Seconds init_rpc may take to rendezvous and for every worker to join (also the store's
    /// default timeout); 0, negative or not finite: Store::kDefaultTimeout (300 s).
    double init_timeout = 0;

    RpcBackendOptions() = default;
    RpcBackendOptions(double rpc_timeout, std::string init_method);
    RpcBackendOptions(const RpcBackendOptions&) = default;
    RpcBackendOptions(RpcBackendOptions&&) = default;
    RpcBackendOptions& operator=(const RpcBackendOptions&) = default;
    RpcBackendOptions& operator=(RpcBackendOptions&&) = default;
    virtual ~RpcBackendOptions() = default;

    /// Checks the values: rpc_timeout must be finite and >= 0 (Errc::invalid_argument otherwise).
    [[nodiscard]] virtual Result<void> validate() const;
};

/// Options of the built-in TENSORPIPE backend.
struct TP_API TensorPipeRpcBackendOptions : RpcBackendOptions {
    /// Size of the pool that runs blocking handlers; must be positive.
    int num_worker_threads = DEFAULT_NUM_WORKER_THREADS;
    /// Per peer worker: where this worker's devices land on that peer.
    DeviceMaps device_maps;
    /// The devices this worker uses; empty: derived from the device maps (CPU dropped).
    std::vector<Device> devices;
    /// Transports to use, highest priority first (an earlier one wins); nullopt: every one built
    /// in, by default priority (shm > uds > uv; shm is not built yet). Names: "uv" (TCP; "tcp" is
    /// taken as "uv"), "uds" (Unix sockets, same host and user), "shm", "ibv" (recognised, not
    /// built: left out). An unknown name is invalid_argument (validate); a list naming no built
    /// transport fails init with not_supported.
    std::optional<std::vector<std::string>> transports;
    /// Channels to use, highest priority first; nullopt: every channel built in. Names are
    /// TensorPipe's (basic, cma, mpt_uv, xth, cuda_basic, cuda_ipc, cuda_xth, cuda_gdr); the native
    /// agent builds basic and cma (CPU), cuda_ipc and cuda_basic (CUDA builds; offered with cuda
    /// devices). An unknown name is invalid_argument; a list without a built channel fails init
    /// with not_supported.
    std::optional<std::vector<std::string>> channels;
    /// Address the TCP (uv) transport listens on ("host", "host:port"; "unix:/path" is not
    /// supported); empty: chosen automatically (TP_SOCKET_IFNAME, the host name's address).
    std::string listen_address;
    /// The group's shared secret (any bytes, at most 64 KiB): every connection then proves on both
    /// sides that it holds it, and a worker without it is refused (Errc::unauthorized). Empty: the
    /// file named by auth_key_file or TP_RPC_AUTH_KEY_FILE, else the TP_RPC_AUTH_KEY variable, else
    /// no authentication. Every worker of a group must use the same key. Never logged; its bytes
    /// are wiped when the last copy of it (the options', the agent's) goes (Secret).
    Secret auth_key;
    /// A file holding the shared secret (read at init, trailing newlines dropped), when auth_key
    /// is empty; empty: TP_RPC_AUTH_KEY_FILE. A file that cannot be read fails init.
    std::string auth_key_file;
    /// Dynamic groups: seconds a member's heartbeat may stand still before the others probe it and,
    /// when a second member (or its heartbeat) confirms it unreachable, remove it (a lost
    /// connection probes at once); must be positive.
    double member_timeout = DEFAULT_MEMBER_TIMEOUT_SEC;

    // Bounds on what a peer can make this worker hold or wait for (docs/protocol.md, "Limits"): a
    // peer past one loses its connection (or that frame), and the worker goes on serving the others.
    /// Payload plus tensor bytes of one frame (a larger announcement closes the connection): 64 GiB.
    std::size_t max_frame_bytes = std::size_t(1) << 36;
    /// Bytes all connections together may hold for frames still arriving (a frame that would pass
    /// it fails, and its sender gets the error): 16 GiB.
    std::size_t receive_budget_bytes = std::size_t(16) << 30;
    /// Seconds a connection's handshake may take: 10.
    double handshake_timeout = 10;
    /// Seconds a frame whose first bytes arrived may take to arrive whole (a slow or stalled
    /// sender's connection closes); 0: no bound. 120.
    double frame_timeout = 120;
    /// Seconds a connection may receive nothing before it closes (a peer that went silent without
    /// closing: a hung host, a half-open socket): 600 by default; 0: never. Agents send a
    /// keep-alive on a connection that was quiet for a third of this (of 600 s at most), so live
    /// peers are never cut; every worker of a group should use the same value.
    double idle_timeout = 600;
    /// Inbound connections held at once (handshaking or serving); beyond it new ones are closed at
    /// once: 4096.
    std::size_t max_inbound_connections = 4096;
    /// The store server this worker starts when it hosts the rendezvous store (rank 0 of tcp://,
    /// or of env:// without a launcher's store): its limits (TcpStoreServerOptions' defaults:
    /// values of 64 MiB, 4 GiB stored, 16,384 connections, ...) and bind host; the port comes
    /// from the init method. init_rpc reads it.
    TcpStoreServerOptions hosted_store;

    TensorPipeRpcBackendOptions() = default;
    TensorPipeRpcBackendOptions(double rpc_timeout, std::string init_method,
                                int num_worker_threads = DEFAULT_NUM_WORKER_THREADS);

    /// Merges `map` into device_maps[to]. The result must stay one-to-one: a source already mapped
    /// elsewhere, or two sources mapped to one target, is Errc::invalid_argument naming the devices,
    /// and then nothing changes.
    [[nodiscard]] Result<void> set_device_map(const std::string& to, const DeviceMap& map);
    /// Replaces devices. Checked against the device count when the backend starts.
    void set_devices(std::vector<Device> devices);

    /// The base checks plus num_worker_threads > 0, member_timeout > 0, auth_key at most 64 KiB, known names in
    /// transports and channels, positive byte and connection bounds, a positive handshake_timeout and
    /// frame and idle timeouts >= 0 (Errc::invalid_argument otherwise, naming the option).
    [[nodiscard]] Result<void> validate() const override;
};

}  // namespace tensorplay
