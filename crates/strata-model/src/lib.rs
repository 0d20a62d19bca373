//! Forward passes of the models Strata serves, over any `strata-kernels` backend.

mod assistant;
mod audio;
mod audio_device;
mod bnb4;
#[cfg(feature = "cuda")]
mod cuda_upload;
mod decode_graph;
mod device_ops;
mod draft_graph;
mod drafting;
mod error;
mod forward;
mod greedy_rows;
mod host_ops;
mod kv_cache;
mod launch;
mod linear;
mod lora;
mod model;
mod paged_kv;
pub mod quantize;
#[cfg(test)]
mod reference_file;
mod runner;
mod tensors;
mod vision;
mod vision_device;
mod weights_swap;

pub use assistant::{Assistant, DraftSeq, Drafted};
pub use audio::{AudioTower, EncodedAudio};
pub use audio_device::DeviceAudioTower;
pub use decode_graph::{bucket_for, decode_buckets};
pub use drafting::Drafting;
pub use error::{ModelError, Result};
pub use greedy_rows::{GreedyRows, RowChoices};
pub use kv_cache::{DecodeGraphs, KvCache, PagedStorage};
pub use launch::Launched;
pub use linear::{upload_linear, upload_linear_as, HostTable, Linear, QuantUpload, QuantWeight};
pub use lora::{LoraAdapter, LoraInfo, LoraStats, Target as LoraTarget};
pub use model::{LoadOptions, LoadProgress, Model};
pub use runner::{ModelHandle, ModelRunner, SwapModel};
pub use strata_kernels::sampling::FED_TOKEN;
pub use strata_types::batch::{self, ForwardBatch, ForwardOutput, LogitsMode, SeqChunk};
pub use tensors::{LayerTensors, ModelTensors};
pub use vision::{EncodedImage, VisionTower};
pub use vision_device::{DeviceImage, DeviceVisionTower};
