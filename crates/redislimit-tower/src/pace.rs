//! Pace requests per host before they reach the inner service.

pub mod future;
mod layer;
mod service;
mod settings;

pub use self::layer::PaceLayer;
pub use self::service::Pace;
