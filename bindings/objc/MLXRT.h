// MLXRT.h — Objective-C wrapper over the mlxrt C API (mlxrt.h).
//
// MLXRTEngine loads a model; -submitRequestWithParameters:queue:eventHandler:error:
// starts a request and returns an MLXRTRequestTask (cancel it with -cancel).
// Events (MLXRTEvent: text deltas, then one done or error event) are
// delivered by dispatch_async to the queue the caller names, never on the
// main thread implicitly. The engine also gives the model's facts (info),
// its counters (stats), its tokenizer (tokenize/detokenize) and chat
// template (renderChat), as the C API does. Images for models with a vision
// tower are MLXRTImage objects (NSData: an encoded file or raw pixels) in
// MLXRTMessage.images, audio for models with an audio tower MLXRTAudio
// objects (a WAV file, or float samples) in MLXRTMessage.audio. Failures are
// NSErrors in MLXRTErrorDomain whose
// codes are the C library's mlxrt_status values.
//
// Builds with ARC or manual reference counting, on Apple platforms and with
// GNUstep (clang -fblocks, a libdispatch).
#import <Foundation/Foundation.h>
#include <dispatch/dispatch.h>
#include <stdint.h>

// Apple's Swift annotations; GNUstep's Foundation lacks some of them.
#ifndef NS_SWIFT_NAME
#define NS_SWIFT_NAME(name)
#endif
#ifndef NS_SWIFT_SENDABLE
#if defined(__has_attribute) && __has_attribute(swift_attr)
#define NS_SWIFT_SENDABLE __attribute__((swift_attr("@Sendable")))
#else
#define NS_SWIFT_SENDABLE
#endif
#endif
#ifndef NS_ERROR_ENUM
#define NS_ERROR_ENUM(domain, name) NS_ENUM(NSInteger, name)
#endif
// GNUstep defines NS_UNAVAILABLE as nothing; make -init really unavailable.
#if defined(__APPLE__) || !__has_attribute(unavailable)
#define MLXRT_UNAVAILABLE NS_UNAVAILABLE
#else
#define MLXRT_UNAVAILABLE __attribute__((unavailable))
#endif

// The GNU runtime's fragile ABI (GNUstep with GCC's libobjc) cannot make
// instance variables for properties, nor take them in class extensions or
// @implementation blocks: there the classes declare them below. Apple's
// runtime (and libobjc2) make them; its clients never see these blocks.
#if !__has_feature(objc_nonfragile_abi)
#define MLXRT_FRAGILE_IVARS 1
#endif

NS_ASSUME_NONNULL_BEGIN

/// The domain of every NSError this wrapper makes.
FOUNDATION_EXPORT NSErrorDomain const MLXRTErrorDomain;

/// Error codes: the C library's `mlxrt_status` values, never renumbered.
typedef NS_ERROR_ENUM(MLXRTErrorDomain, MLXRTErrorCode){
    MLXRTErrorInvalidArgument = 1,  // NULL/out-of-range value, wrong struct size
    MLXRTErrorInvalidUTF8 = 2,
    MLXRTErrorInvalidJSON = 3,      // a JSON argument did not parse
    MLXRTErrorModelLoad = 4,        // missing file, bad config, bad tensor
    MLXRTErrorUnsupported = 5,
    MLXRTErrorMLX = 6,              // MLX raised an error
    MLXRTErrorBusy = 7,             // too many requests in flight; retry later
    MLXRTErrorEnginePoisoned = 8,   // the engine failed earlier and takes no work
    MLXRTErrorIO = 9,
    MLXRTErrorInternal = 10,        // a bug in mlxrt
    MLXRTErrorTimeout = 11,         // nothing arrived in time (pull streams)
    MLXRTErrorAborted = 12,         // a callback asked to stop (model loading)
    MLXRTErrorEndOfStream = 13,     // a pull stream had already ended
};

/// `MLXRTEngineConfiguration.device`.
typedef NS_ENUM(NSInteger, MLXRTDevice) {
    MLXRTDeviceAutomatic = 0,  // the GPU where present
    MLXRTDeviceCPU = 1,
    MLXRTDeviceGPU = 2,
};

typedef NS_ENUM(NSInteger, MLXRTEventKind) {
    MLXRTEventKindText = 1,   // new text (complete UTF-8) and its token ids
    MLXRTEventKindDone = 2,   // the request finished (last event)
    MLXRTEventKindError = 3,  // the request failed (last event)
    MLXRTEventKindToolCall = 4,  // the model called a tool (not last)
};

/// Which part of the output a text event belongs to.
typedef NS_ENUM(NSInteger, MLXRTChannel) {
    MLXRTChannelContent = 0,
    MLXRTChannelReasoning = 1,  // thinking, for models that think
};

typedef NS_ENUM(NSInteger, MLXRTFinishReason) {
    MLXRTFinishReasonNone = 0,       // not a done event
    MLXRTFinishReasonStop = 1,       // end-of-sequence token or stop string
    MLXRTFinishReasonLength = 2,     // maxTokens or the context length
    MLXRTFinishReasonCancelled = 3,  // -[MLXRTRequestTask cancel] or engine teardown
    MLXRTFinishReasonToolCalls = 4,  // the model ended its turn after calling tools
};

/// Engine settings. Like NSURLSessionConfiguration it is mutable, and the
/// engine copies it, so later changes do not affect an engine. Defaults are
/// the C library's (`mlxrt_engine_config_init`).
NS_SWIFT_NAME(MLXRTEngine.Configuration)
@interface MLXRTEngineConfiguration : NSObject <NSCopying>
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSString *_modelPath, *_promptCacheDirectory, *_draftModelPath;
    MLXRTDevice _device;
    NSUInteger _maxInFlight, _maxRows, _prefillChunk;
    uint64_t _kvBudget, _seed, _promptCacheBytes;
}
#endif
- (instancetype)initWithModelPath:(NSString *)modelPath NS_DESIGNATED_INITIALIZER;
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
/// A .gguf file or a Hugging Face MLX-format folder.
@property (nonatomic, copy) NSString *modelPath;
@property (nonatomic) MLXRTDevice device;
/// Requests accepted but not finished before submit fails with Busy.
@property (nonatomic) NSUInteger maxInFlight;
/// Requests batched together; the rest wait in FIFO order.
@property (nonatomic) NSUInteger maxRows;
@property (nonatomic) NSUInteger prefillChunk;
@property (nonatomic) uint64_t kvBudget;
/// Base seed for requests without their own.
@property (nonatomic) uint64_t seed;
/// Bytes of prompt-cache snapshots kept in memory; 0 turns the cache off.
@property (nonatomic) uint64_t promptCacheBytes;
/// Where the prompt cache persists across restarts; nil = memory only.
@property (nonatomic, copy, nullable) NSString *promptCacheDirectory;
/// A smaller model with the same tokenizer that drafts tokens for
/// speculative decoding; requests then default to draft speculation
/// (`speculation`). nil = none.
@property (nonatomic, copy, nullable) NSString *draftModelPath;
@end

/// How the bytes of a raw-pixel MLXRTImage are laid out: 8 bits per
/// channel (`MLXRT_PIXEL_*`). Alpha is ignored.
typedef NS_ENUM(NSInteger, MLXRTPixelFormat) {
    MLXRTPixelFormatRGB8 = 1,   // red, green, blue
    MLXRTPixelFormatRGBA8 = 2,  // red, green, blue, alpha
    MLXRTPixelFormatBGRA8 = 3,  // blue first: a CGBitmapContext with
                                // kCGImageAlphaNoneSkipFirst (or PremultipliedFirst)
                                // | kCGBitmapByteOrder32Little, as CVPixelBuffer's BGRA
};

/// An image for a chat message (for models with a vision tower: their
/// info.modalities has MLXRT_MODALITY_IMAGE): an encoded file, or raw pixels. Immutable; it keeps (retains) the NSData, and mlxrt
/// reads it during submit only, so a buffer wrapped without copying,
///   [NSData dataWithBytesNoCopy:base length:bytesPerRow * height freeWhenDone:NO]
/// may be reused once submit has returned.
///   MLXRTImage *photo = [MLXRTImage imageWithData:[NSData dataWithContentsOfFile:@"cat.jpg"]];
///   MLXRTMessage *m = [MLXRTMessage userMessage:@"What is in this picture?" images:@[ photo ]];
/// Undecodable data, a buffer shorter than its rows, or more than 50 million
/// pixels fail the submit with MLXRTErrorInvalidArgument; an image sent to a
/// model without a vision tower, with MLXRTErrorUnsupported.
NS_SWIFT_SENDABLE
@interface MLXRTImage : NSObject <NSCopying>
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSData *_data;
    NSInteger _pixelFormat;
    NSUInteger _width, _height, _bytesPerRow;
}
#endif
/// A JPEG, PNG or WebP file's bytes.
+ (instancetype)imageWithData:(NSData *)data;
/// Raw pixels: `height` rows `bytesPerRow` apart (0 = packed), each `width`
/// pixels in `format`.
+ (instancetype)imageWithPixels:(NSData *)pixels
                          width:(NSUInteger)width
                         height:(NSUInteger)height
                    bytesPerRow:(NSUInteger)bytesPerRow
                         format:(MLXRTPixelFormat)format;
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
@property (nonatomic, readonly, copy) NSData *data;
/// 0 for an encoded file, else an MLXRTPixelFormat.
@property (nonatomic, readonly) NSInteger pixelFormat;
/// Raw pixels only (0 for an encoded file).
@property (nonatomic, readonly) NSUInteger width;
@property (nonatomic, readonly) NSUInteger height;
@property (nonatomic, readonly) NSUInteger bytesPerRow;
@end

/// An audio clip for a chat message (for models with an audio tower: their
/// info.modalities has MLXRT_MODALITY_AUDIO): a WAV file, or mono float
/// samples. Immutable; it keeps the NSData, which mlxrt reads during submit
/// only. Audio at another rate than the model's (16 kHz for Gemma 4) fails
/// the submit with MLXRTErrorUnsupported, undecodable data with
/// MLXRTErrorInvalidArgument.
///   MLXRTAudio *clip = [MLXRTAudio audioWithData:[NSData dataWithContentsOfFile:@"hello.wav"]];
///   MLXRTMessage *m = [MLXRTMessage userMessage:@"What is said?" images:@[] audio:@[ clip ]];
NS_SWIFT_SENDABLE
@interface MLXRTAudio : NSObject <NSCopying>
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSData *_data;
    NSUInteger _sampleRate;
}
#endif
/// A WAV file's bytes (PCM 8/16/24/32-bit or float; channels are averaged).
+ (instancetype)audioWithData:(NSData *)data;
/// Mono samples in -1..1 (`float`s, native byte order) at `sampleRate` Hz.
+ (instancetype)audioWithSamples:(NSData *)samples sampleRate:(NSUInteger)sampleRate;
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
@property (nonatomic, readonly, copy) NSData *data;
/// 0 for a WAV file.
@property (nonatomic, readonly) NSUInteger sampleRate;
@end

/// One chat message, optionally with images and audio (which come before its
/// text, as content parts: images, then audio). Immutable.
NS_SWIFT_SENDABLE
@interface MLXRTMessage : NSObject <NSCopying>
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSString *_role, *_content;
    NSArray *_images, *_audio;
}
#endif
+ (instancetype)messageWithRole:(NSString *)role content:(NSString *)content;
+ (instancetype)systemMessage:(NSString *)content;
+ (instancetype)userMessage:(NSString *)content;
+ (instancetype)assistantMessage:(NSString *)content;
+ (instancetype)userMessage:(NSString *)content images:(NSArray<MLXRTImage *> *)images;
+ (instancetype)userMessage:(NSString *)content images:(NSArray<MLXRTImage *> *)images audio:(NSArray<MLXRTAudio *> *)audio;
- (instancetype)initWithRole:(NSString *)role
                     content:(NSString *)content
                      images:(NSArray<MLXRTImage *> *)images
                       audio:(NSArray<MLXRTAudio *> *)audio NS_DESIGNATED_INITIALIZER;
- (instancetype)initWithRole:(NSString *)role content:(NSString *)content images:(NSArray<MLXRTImage *> *)images;
- (instancetype)initWithRole:(NSString *)role content:(NSString *)content;
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
@property (nonatomic, readonly, copy) NSString *role;
@property (nonatomic, readonly, copy) NSString *content;
/// Empty unless made with images.
@property (nonatomic, readonly, copy) NSArray<MLXRTImage *> *images;
/// Empty unless made with audio.
@property (nonatomic, readonly, copy) NSArray<MLXRTAudio *> *audio;
@end

/// Request settings: give `messages`, `prompt` or `promptTokens`. Mutable and
/// copied at submit; defaults are the C library's (`mlxrt_request_params_init`).
NS_SWIFT_NAME(MLXRTEngine.RequestParameters)
@interface MLXRTRequestParameters : NSObject <NSCopying>
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSArray *_messages, *_promptTokens, *_stopStrings;
    NSString *_prompt, *_optionsJSON, *_cacheNamespace, *_responseFormat, *_speculation;
    NSNumber *_seed;
    NSUInteger _maxTokens;
    NSInteger _topK;
    float _temperature, _topP, _minP, _repetitionPenalty;
    BOOL _usesPromptCache, _logprobs;
    NSUInteger _topLogprobs;
    NSInteger _thinking;
}
#endif
- (instancetype)init NS_DESIGNATED_INITIALIZER;
+ (instancetype)parametersWithMessages:(NSArray<MLXRTMessage *> *)messages;
/// Chat messages, rendered with the model's chat template.
@property (nonatomic, copy, nullable) NSArray<MLXRTMessage *> *messages;
/// Raw prompt text (special-token text is parsed).
@property (nonatomic, copy, nullable) NSString *prompt;
/// Prompt token ids (NSNumber, unsigned 32-bit), used as they are.
@property (nonatomic, copy, nullable) NSArray<NSNumber *> *promptTokens;
@property (nonatomic) NSUInteger maxTokens;  // default 256
@property (nonatomic) float temperature;     // 0 = greedy (default)
@property (nonatomic) float topP;            // 0 = off
@property (nonatomic) NSInteger topK;        // 0 = off
@property (nonatomic) float minP;            // 0 = off
@property (nonatomic) float repetitionPenalty;  // 1 = off
/// Makes sampling reproducible; nil = the engine's seed sequence.
@property (nonatomic, copy, nullable) NSNumber *seed;
/// Generation stops when one appears in the text, which ends before it.
@property (nonatomic, copy) NSArray<NSString *> *stopStrings;
/// OpenAI-style fields as a JSON object, applied after the fields above.
@property (nonatomic, copy, nullable) NSString *optionsJSON;
/// Structured output: the JSON of the `response_format` option, e.g.
/// {"type":"json_schema","json_schema":{"schema":{...}}}, {"type":"json_object"},
/// {"type":"regex","pattern":"..."} or {"type":"grammar","lark":"..."}. Merged
/// into optionsJSON; an invalid schema fails the submit (invalid argument).
@property (nonatomic, copy, nullable) NSString *responseFormat;
/// Speculative decoding: the JSON of the `speculation` option, e.g.
/// @"\"off\"", @"\"ngram\"", @"\"draft\"" (needs the engine's draft model) or
/// @"{\"type\":\"draft\",\"num_tokens\":4}". Merged into optionsJSON.
@property (nonatomic, copy, nullable) NSString *speculation;
/// Prompt-cache namespace: cached state is shared only within one.
@property (nonatomic, copy, nullable) NSString *cacheNamespace;
/// NO: this request neither uses nor fills the prompt cache.
@property (nonatomic) BOOL usesPromptCache;
/// For models with a thinking mode: 1 = think, 0 = do not, -1 = the
/// template's default (default).
@property (nonatomic) NSInteger thinking;
/// YES: text events carry each token's log-probability (MLXRTEvent.logprobs)
/// with `topLogprobs` most likely alternatives (0...20).
@property (nonatomic) BOOL logprobs;
@property (nonatomic) NSUInteger topLogprobs;
@end

/// Token counts and timings of a finished request. Immutable.
NS_SWIFT_SENDABLE
@interface MLXRTUsage : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSUInteger _promptTokens, _cachedTokens, _completionTokens;
    NSTimeInterval _timeToFirstToken, _prefillTime, _decodeTime;
    double _prefillTokensPerSecond, _decodeTokensPerSecond;
}
#endif
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
@property (nonatomic, readonly) NSUInteger promptTokens;
/// Prompt tokens served from the prompt cache.
@property (nonatomic, readonly) NSUInteger cachedTokens;
@property (nonatomic, readonly) NSUInteger completionTokens;
/// Submission to first generated token, prompt processing, and first to
/// last token, in seconds.
@property (nonatomic, readonly) NSTimeInterval timeToFirstToken;
@property (nonatomic, readonly) NSTimeInterval prefillTime;
@property (nonatomic, readonly) NSTimeInterval decodeTime;
@property (nonatomic, readonly) double prefillTokensPerSecond;
@property (nonatomic, readonly) double decodeTokensPerSecond;
@end

/// A generated token's log-probability (natural log, over the model's
/// distribution before temperature and sampling filters) and, if asked for,
/// the most likely alternatives, most likely first. Immutable.
NS_SWIFT_SENDABLE
@interface MLXRTTokenLogprob : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    uint32_t _tokenID;
    float _logprob;
    NSArray *_topAlternatives;
}
#endif
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
@property (nonatomic, readonly) uint32_t tokenID;
@property (nonatomic, readonly) float logprob;
/// The alternatives (their own topAlternatives are empty).
@property (nonatomic, readonly, copy) NSArray<MLXRTTokenLogprob *> *topAlternatives;
@end

/// One event of a request. Immutable. A request yields any number of text
/// events, then exactly one done or error event, and nothing after it.
NS_SWIFT_SENDABLE
@interface MLXRTEvent : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    MLXRTEventKind _kind;
    uint64_t _requestID;
    NSString *_text;
    NSArray *_tokenIDs;
    MLXRTFinishReason _finishReason;
    NSInteger _stopIndex;
    MLXRTUsage *_usage;
    NSError *_error;
    MLXRTChannel _channel;
    NSString *_toolCallID, *_toolName, *_toolArguments;
    NSArray *_logprobs;
}
#endif
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
@property (nonatomic, readonly) MLXRTEventKind kind;
@property (nonatomic, readonly) uint64_t requestID;
/// Text events: the new text ("" when only ids of text-less tokens come).
@property (nonatomic, readonly, copy) NSString *text;
/// Text events: ids of the tokens the text came from; else empty.
@property (nonatomic, readonly, copy) NSArray<NSNumber *> *tokenIDs;
@property (nonatomic, readonly) MLXRTFinishReason finishReason;
/// Done by a stop string: its index in stopStrings; else NSNotFound.
@property (nonatomic, readonly) NSInteger stopIndex;
/// Done events: counts and timings.
@property (nonatomic, readonly, nullable) MLXRTUsage *usage;
/// Error events: the failure (MLXRTErrorDomain).
@property (nonatomic, readonly, nullable) NSError *error;
/// Text events: content or reasoning.
@property (nonatomic, readonly) MLXRTChannel channel;
/// Tool-call events: an id unique in the engine, the tool's name, and its
/// arguments as a JSON object.
@property (nonatomic, readonly, copy, nullable) NSString *toolCallID;
@property (nonatomic, readonly, copy, nullable) NSString *toolName;
@property (nonatomic, readonly, copy, nullable) NSString *toolArguments;
/// Text events of a request with `logprobs`: one entry per token of
/// tokenIDs, in order; else empty.
@property (nonatomic, readonly, copy) NSArray<MLXRTTokenLogprob *> *logprobs;
/// YES for done and error events.
@property (nonatomic, readonly, getter=isFinal) BOOL final;
@end

typedef void (^MLXRTEventHandler)(MLXRTEvent *event) NS_SWIFT_SENDABLE;

/// A submitted request. Releasing it does not cancel the request.
NS_SWIFT_SENDABLE
@interface MLXRTRequestTask : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    struct mlxrt_request *_request;
    uint64_t _requestID;
}
#endif
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
/// The requestID of its events.
@property (nonatomic, readonly) uint64_t requestID;
/// Stops the request while queued, between prefill chunks or between decode
/// steps; it then ends with a done event whose reason is Cancelled (unless it
/// had already ended). Idempotent; harmless after the engine is gone.
- (void)cancel;
@end

/// Facts about an engine's model (`mlxrt_engine_info`). Immutable.
NS_SWIFT_SENDABLE
@interface MLXRTEngineInfo : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSString *_architecture, *_modelFormat, *_device, *_mlxVersion;
    uint64_t _contextLength, _parameterBytes;
    uint32_t _vocabSize, _numLayers, _hiddenSize, _modalities;
    int64_t _bosTokenID;
    NSArray *_eosTokenIDs, *_specialTokenIDs;
    BOOL _hasChatTemplate, _supportsTools, _supportsReasoning;
}
#endif
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
/// "llama", ...
@property (nonatomic, readonly, copy) NSString *architecture;
/// "gguf" or "mlx-folder".
@property (nonatomic, readonly, copy) NSString *modelFormat;
/// "cpu" or "gpu".
@property (nonatomic, readonly, copy) NSString *device;
/// The MLX version the library runs on.
@property (nonatomic, readonly, copy) NSString *mlxVersion;
/// Maximum sequence length (prompt + generated); 0 if unknown.
@property (nonatomic, readonly) uint64_t contextLength;
@property (nonatomic, readonly) uint32_t vocabSize;
@property (nonatomic, readonly) uint32_t numLayers;
@property (nonatomic, readonly) uint32_t hiddenSize;
@property (nonatomic, readonly) uint64_t parameterBytes;
/// Beginning-of-sequence token id, or -1.
@property (nonatomic, readonly) int64_t bosTokenID;
/// Ids that end generation.
@property (nonatomic, readonly, copy) NSArray<NSNumber *> *eosTokenIDs;
/// Ids of special tokens (control tokens such as `<|im_start|>`).
@property (nonatomic, readonly, copy) NSArray<NSNumber *> *specialTokenIDs;
/// The model has a chat template (messages work).
@property (nonatomic, readonly) BOOL hasChatTemplate;
@property (nonatomic, readonly) BOOL supportsTools;
/// The chat template has a thinking mode.
@property (nonatomic, readonly) BOOL supportsReasoning;
/// `MLXRT_MODALITY_*` bits of accepted inputs.
@property (nonatomic, readonly) uint32_t modalities;
@end

/// The engine's counters at one moment (`mlxrt_engine_stats`); published by
/// the engine after every step, so they lag events by a moment. Immutable.
NS_SWIFT_SENDABLE
@interface MLXRTEngineStats : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    uint64_t _queued, _active, _inFlight, _completed, _kvBytes, _kvReserved, _activeMemory, _peakMemory,
        _cacheMemory, _promptCacheHits, _promptCacheMisses, _promptCacheHitTokens, _promptCacheMemoryBytes,
        _promptCacheDiskBytes, _encoderCacheBytes, _encoderCacheEntries, _encoderCacheHits, _towerRuns;
}
#endif
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
/// Requests waiting for admission, prefilling or generating, submitted and
/// not yet ended, and ended since the engine started.
@property (nonatomic, readonly) uint64_t queued;
@property (nonatomic, readonly) uint64_t active;
@property (nonatomic, readonly) uint64_t inFlight;
@property (nonatomic, readonly) uint64_t completed;
/// Bytes held by KV caches now, and reserved by running requests.
@property (nonatomic, readonly) uint64_t kvBytes;
@property (nonatomic, readonly) uint64_t kvReserved;
/// MLX allocator: bytes in use, peak, and held in its cache.
@property (nonatomic, readonly) uint64_t activeMemory;
@property (nonatomic, readonly) uint64_t peakMemory;
@property (nonatomic, readonly) uint64_t cacheMemory;
/// Prompt cache: requests that reused cached tokens, that did not, prompt
/// tokens it supplied, bytes in memory and on disk.
@property (nonatomic, readonly) uint64_t promptCacheHits;
@property (nonatomic, readonly) uint64_t promptCacheMisses;
@property (nonatomic, readonly) uint64_t promptCacheHitTokens;
@property (nonatomic, readonly) uint64_t promptCacheMemoryBytes;
@property (nonatomic, readonly) uint64_t promptCacheDiskBytes;
/// Encoder cache (vision tower outputs by image content): bytes and entries
/// it holds, images it supplied, and images the vision tower encoded (a
/// repeated image counts as a hit, not a tower run).
@property (nonatomic, readonly) uint64_t encoderCacheBytes;
@property (nonatomic, readonly) uint64_t encoderCacheEntries;
@property (nonatomic, readonly) uint64_t encoderCacheHits;
@property (nonatomic, readonly) uint64_t towerRuns;
@end

/// A chat rendered with the model's template: the prompt text and its token
/// ids, exactly what a request with these messages would process. Immutable.
NS_SWIFT_SENDABLE
@interface MLXRTRenderedChat : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    NSString *_text;
    NSArray *_tokenIDs;
}
#endif
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;
@property (nonatomic, readonly, copy) NSString *text;
@property (nonatomic, readonly, copy) NSArray<NSNumber *> *tokenIDs;
@end

/// A loaded model and its threads. Thread-safe: any method may be called from
/// any thread. Deallocation cancels the requests in flight, delivers their
/// last events, and waits for the engine's threads to stop.
NS_SWIFT_SENDABLE
@interface MLXRTEngine : NSObject
#if MLXRT_FRAGILE_IVARS
{
  @private
    struct mlxrt_engine *_engine;
    MLXRTEngineInfo *_info;
}
#endif
/// Loads the model (blocks until it is ready; call it off the main thread).
- (nullable instancetype)initWithConfiguration:(MLXRTEngineConfiguration *)configuration
                                         error:(NSError **)error NS_DESIGNATED_INITIALIZER;
- (instancetype)init MLXRT_UNAVAILABLE;
+ (instancetype)new MLXRT_UNAVAILABLE;

/// Submits a request. Validation, templating and tokenization happen here;
/// generation never blocks this call. `handler` receives the events by
/// dispatch_async on `queue` (a serial queue sees them in order). On failure
/// it returns nil, sets `error`, and `handler` is never called.
- (nullable MLXRTRequestTask *)submitRequestWithParameters:(MLXRTRequestParameters *)parameters
                                                     queue:(dispatch_queue_t)queue
                                              eventHandler:(MLXRTEventHandler)handler
                                                     error:(NSError **)error
    NS_SWIFT_NAME(submit(_:queue:eventHandler:));

/// The model's facts, read when the engine was made.
@property (nonatomic, readonly) MLXRTEngineInfo *info;

/// The engine's counters now.
@property (nonatomic, readonly) MLXRTEngineStats *stats;

/// The token ids of `text` (no BOS added); with `parseSpecial`, special-token
/// text such as `<|im_start|>` becomes its id.
- (nullable NSArray<NSNumber *> *)tokenize:(NSString *)text
                              parseSpecial:(BOOL)parseSpecial
                                     error:(NSError **)error
    NS_SWIFT_NAME(tokenize(_:parseSpecial:));

/// The text of token ids (bytes that are not valid UTF-8 become U+FFFD);
/// with `skipSpecial`, special tokens produce no text.
- (nullable NSString *)detokenize:(NSArray<NSNumber *> *)tokenIDs
                      skipSpecial:(BOOL)skipSpecial
                            error:(NSError **)error
    NS_SWIFT_NAME(detokenize(_:skipSpecial:));

/// Renders `parameters.messages` with the model's chat template, and the
/// tools and chat_template_kwargs of `parameters.optionsJSON`. Messages with
/// images fail: mlxrt_render_chat takes no images.
- (nullable MLXRTRenderedChat *)renderChatWithParameters:(MLXRTRequestParameters *)parameters
                                                   error:(NSError **)error
    NS_SWIFT_NAME(renderChat(_:));

/// The library's version ("0.1.0").
@property (class, nonatomic, readonly) NSString *libraryVersion;
@end

NS_ASSUME_NONNULL_END
