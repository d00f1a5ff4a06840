//! The libibverbs provider on a machine without RDMA hardware (feature `ibverbs`): listing
//! devices is not an error and shows the soft devices; a hardware name that does not exist
//! is a clear error.
#![cfg(feature = "ibverbs")]

use rdmx_verbs::{Device, VerbsError};

#[test]
fn listing_without_rdma_hardware_is_not_an_error() {
    let devices = Device::list().expect("listing devices never fails for lack of hardware");
    assert!(devices.iter().any(|d| d.name().starts_with("soft:")));
    // Any hardware device that is listed can be opened and queried.
    for d in devices.iter().filter(|d| !d.name().starts_with("soft:")) {
        let ctx = d.context().expect("a listed device opens");
        let attr = ctx.query_device();
        assert!(attr.phys_port_cnt >= 1, "{}: {attr:?}", d.name());
        let port = ctx.query_port(1).expect("port 1");
        let _ = (port, ctx.query_gid(1, 0));
    }
}

#[test]
fn opening_a_hardware_device_that_does_not_exist_is_a_clear_error() {
    let e = Device::open("mlx5_does_not_exist").unwrap_err();
    assert!(
        matches!(e, VerbsError::DeviceNotFound(ref n) if n == "mlx5_does_not_exist"),
        "{e}"
    );
    assert!(e.to_string().contains("mlx5_does_not_exist"));
}
