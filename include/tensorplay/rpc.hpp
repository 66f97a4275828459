// The one header a user of tensorplay-rpc includes: every public facility of every layer.
#pragma once

#include <tensorplay/config.hpp>

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/error.hpp>
#include <tensorplay/core/export.hpp>
#include <tensorplay/core/log.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/runtime.hpp>
#include <tensorplay/core/secret.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/core/wire.hpp>

#include <tensorplay/device/backend.hpp>
#include <tensorplay/device/device.hpp>
#include <tensorplay/device/device_map.hpp>
#include <tensorplay/device/tensor.hpp>

#include <tensorplay/store/collectives.hpp>
#include <tensorplay/store/file_store.hpp>
#include <tensorplay/store/hash_store.hpp>
#include <tensorplay/store/prefix_store.hpp>
#include <tensorplay/store/rendezvous.hpp>
#include <tensorplay/store/store.hpp>
#include <tensorplay/store/tcp_store.hpp>

#include <tensorplay/transport/address.hpp>
#include <tensorplay/transport/connection.hpp>
#include <tensorplay/transport/listener.hpp>

#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/api.hpp>
#include <tensorplay/rpc/backend_registry.hpp>
#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/debug_info.hpp>
#include <tensorplay/rpc/device_map_exchange.hpp>
#include <tensorplay/rpc/message.hpp>
#include <tensorplay/rpc/options.hpp>
#include <tensorplay/rpc/startup.hpp>
#include <tensorplay/rpc/typed.hpp>
#include <tensorplay/rpc/worker_info.hpp>
