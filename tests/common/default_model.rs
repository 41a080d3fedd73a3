//! The real models the real-model tests load: the default model, on the device they run on,
//! and Gemma-3-270M (another family and vocabulary). Their absence fails the test: real-model
//! tests never skip.

use std::path::PathBuf;

use tandem::model::loaded::LoadOptions;
use tandem::model::{BackendChoice, DeviceSpec, LoadedModel, ModelSource, WeightsDtype};

pub fn default_model() -> PathBuf {
    let p = tandem::model::default_model_path();
    assert!(
        p.is_file(),
        "the default model is missing at {}: run scripts/fetch-default-model",
        p.display()
    );
    p
}

/// Gemma-3-270M's `Q4_K_M` file, as `scripts/fetch-gemma` leaves it.
pub fn gemma_path() -> PathBuf {
    let p = tandem::model::loaded::cache_dir().join("models/gemma-3-270m-Q4_K_M.gguf");
    assert!(
        p.is_file(),
        "Gemma-3-270M is missing at {}: run scripts/fetch-gemma",
        p.display()
    );
    p
}

pub fn load_default(dtype: WeightsDtype) -> LoadedModel {
    load_default_on(dtype, BackendChoice::Auto)
}

/// The default model with the forward `backend` chooses: the tensor backend on
/// `TANDEM_TEST_DEVICE` (`cpu` unless set: scripts/gpu-check sets `cuda`), the own kernels on
/// the CPU.
pub fn load_default_on(dtype: WeightsDtype, backend: BackendChoice) -> LoadedModel {
    load_default_with(&LoadOptions {
        weights_dtype: dtype,
        backend,
        ..Default::default()
    })
}

/// The default model with these options (context 1024), on the test device when the options
/// ask for the tensor backend.
pub fn load_default_with(opts: &LoadOptions) -> LoadedModel {
    let device = match opts.backend {
        BackendChoice::Candle => test_device(),
        _ => DeviceSpec::Cpu,
    };
    LoadedModel::load(
        &ModelSource::Gguf(default_model()),
        &LoadOptions {
            context_len: 1024,
            device,
            ..opts.clone()
        },
    )
    .expect("default model loads")
}

/// Where tests run the tensor backend: `TANDEM_TEST_DEVICE`, else the CPU.
pub fn test_device() -> DeviceSpec {
    std::env::var("TANDEM_TEST_DEVICE")
        .map(|d| d.parse().expect("TANDEM_TEST_DEVICE names a device"))
        .unwrap_or(DeviceSpec::Cpu)
}
