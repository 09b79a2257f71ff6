// swift-tools-version:5.9
// The Swift package over libmlxrt's C API (include/mlxrt.h).
//
// Build libmlxrt first (`cargo build --release` at the repository root), then
// tell the linker where it is, e.g. from this folder:
//   swift build -Xlinker -L../../target/release -Xlinker -rpath -Xlinker ../../target/release
// The tests (Tests/MLXRTTests) load the model named by MLXRT_MODEL;
// scripts/test.sh runs them when `swift` is on PATH.
// An app that ships an XCFramework would replace the CMLXRT system library
// with `.binaryTarget(name: "CMLXRT", path: "CMLXRT.xcframework")` (same module name).
import PackageDescription

let package = Package(
    name: "MLXRT",
    platforms: [.macOS(.v13), .iOS(.v16)],
    products: [
        .library(name: "MLXRT", targets: ["MLXRT"]),
    ],
    targets: [
        // module.modulemap over mlxrt.h; links -lmlxrt.
        .systemLibrary(name: "CMLXRT", path: "Sources/CMLXRT"),
        .target(name: "MLXRT", dependencies: ["CMLXRT"], path: "Sources/MLXRT"),
        .executableTarget(name: "mlxrt-swift-chat", dependencies: ["MLXRT"], path: "Sources/mlxrt-swift-chat"),
        .testTarget(name: "MLXRTTests", dependencies: ["MLXRT"], path: "Tests/MLXRTTests"),
    ]
)
