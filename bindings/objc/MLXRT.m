// MLXRT.m — see MLXRT.h. Compiles with ARC (Apple's default) and with manual
// reference counting (GNUstep on the GNU runtime, which has no ARC); the few
// differences are the macros below.
#import "MLXRT.h"

#include <Block.h>
#include <stdlib.h>
#include <string.h>

#include "mlxrt.h"

#if __has_feature(objc_arc)
#define MLXRT_RELEASE(x) ((void)0)
#define MLXRT_AUTORELEASE(x) (x)
#define MLXRT_BLOCK_COPY(b) [(b) copy]
#define MLXRT_BLOCK_RELEASE(b) ((void)0)
#define MLXRT_DISPATCH_RETAIN(q) ((void)0)
#define MLXRT_DISPATCH_RELEASE(q) ((void)0)
#define MLXRT_SUPER_DEALLOC() ((void)0)
#else
#define MLXRT_RELEASE(x) [(x) release]
#define MLXRT_AUTORELEASE(x) [(x) autorelease]
#define MLXRT_BLOCK_COPY(b) Block_copy(b)
#define MLXRT_BLOCK_RELEASE(b) Block_release(b)
#define MLXRT_DISPATCH_RETAIN(q) dispatch_retain(q)
#define MLXRT_DISPATCH_RELEASE(q) dispatch_release(q)
#define MLXRT_SUPER_DEALLOC() [super dealloc]
#endif

/// -copyWithZone: of an immutable class: the object itself.
#if __has_feature(objc_arc)
#define MLXRT_IMMUTABLE_COPY \
    - (id)copyWithZone:(NSZone *)zone { (void)zone; return self; }
#else
#define MLXRT_IMMUTABLE_COPY \
    - (id)copyWithZone:(NSZone *)zone { (void)zone; return [self retain]; }
#endif

NSErrorDomain const MLXRTErrorDomain = @"MLXRTErrorDomain";

static NSString *string_from_c(const char *s) {
    NSString *out = s ? [NSString stringWithUTF8String:s] : nil;
    return out ? out : @"";
}

static NSError *error_with(mlxrt_status status, NSString *message) {
    NSDictionary *info = @{NSLocalizedDescriptionKey: message};
    return [NSError errorWithDomain:MLXRTErrorDomain code:(NSInteger)status userInfo:info];
}

/// Token ids as NSNumbers (autoreleased).
static NSArray<NSNumber *> *ids_from_c(const uint32_t *ids, size_t n) {
    NSMutableArray<NSNumber *> *out = [NSMutableArray arrayWithCapacity:n];
    for (size_t i = 0; i < n; i++) [out addObject:@(ids[i])];
    return out;
}

/// Token ids as a C array to free() (never NULL, even when empty).
static uint32_t *ids_to_c(NSArray<NSNumber *> *ids) {
    uint32_t *out = calloc(ids.count ? ids.count : 1, sizeof *out);
    for (NSUInteger i = 0; i < ids.count; i++) out[i] = [[ids objectAtIndex:i] unsignedIntValue];
    return out;
}

/// Moves token ids the library returned into an array and frees them.
static NSArray<NSNumber *> *take_tokens(mlxrt_tokens *tokens) {
    NSArray<NSNumber *> *out = ids_from_c(mlxrt_tokens_data(tokens), mlxrt_tokens_len(tokens));
    mlxrt_tokens_free(tokens);
    return out;
}

/// Moves a string the library returned into an NSString and frees it.
static NSString *take_string(char *s) {
    NSString *out = string_from_c(s);
    mlxrt_string_free(s);
    return out;
}

/// Moves a C error object into `*out` (when the caller asked) and frees it.
static void take_error(NSError **out, mlxrt_status status, mlxrt_error *error) {
    if (out) {
        NSString *message = error ? string_from_c(mlxrt_error_message(error)) : string_from_c(mlxrt_status_name(status));
        *out = error_with(status, message);
    }
    mlxrt_error_free(error);
}

// ---- configuration and parameters ----

// Explicit @synthesize: the fragile ABI has no automatic synthesis.
@implementation MLXRTEngineConfiguration
@synthesize modelPath = _modelPath, device = _device, maxInFlight = _maxInFlight, maxRows = _maxRows,
            prefillChunk = _prefillChunk, kvBudget = _kvBudget, seed = _seed,
            promptCacheBytes = _promptCacheBytes, promptCacheDirectory = _promptCacheDirectory,
            draftModelPath = _draftModelPath;

- (instancetype)initWithModelPath:(NSString *)modelPath {
    if ((self = [super init])) {
        mlxrt_engine_config c;
        mlxrt_engine_config_init(&c);  // the defaults live in the library
        _modelPath = [modelPath copy];
        _device = (MLXRTDevice)c.device;
        _maxInFlight = c.max_in_flight;
        _maxRows = c.max_rows;
        _prefillChunk = c.prefill_chunk;
        _kvBudget = c.kv_budget;
        _seed = c.seed;
        _promptCacheBytes = c.prompt_cache_bytes;
    }
    return self;
}

- (id)copyWithZone:(NSZone *)zone {
    MLXRTEngineConfiguration *c = [[[self class] allocWithZone:zone] initWithModelPath:_modelPath];
    c.device = _device;
    c.maxInFlight = _maxInFlight;
    c.maxRows = _maxRows;
    c.prefillChunk = _prefillChunk;
    c.kvBudget = _kvBudget;
    c.seed = _seed;
    c.promptCacheBytes = _promptCacheBytes;
    c.promptCacheDirectory = _promptCacheDirectory;
    c.draftModelPath = _draftModelPath;
    return c;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_modelPath release];
    [_promptCacheDirectory release];
    [_draftModelPath release];
    [super dealloc];
}
#endif
@end

@interface MLXRTImage ()
- (instancetype)initWithData:(NSData *)data
                 pixelFormat:(NSInteger)format
                       width:(NSUInteger)width
                      height:(NSUInteger)height
                 bytesPerRow:(NSUInteger)bytesPerRow;
- (mlxrt_media)media;
@end

@implementation MLXRTImage
@synthesize data = _data, pixelFormat = _pixelFormat, width = _width, height = _height, bytesPerRow = _bytesPerRow;

+ (instancetype)imageWithData:(NSData *)data {
    return MLXRT_AUTORELEASE([[self alloc] initWithData:data pixelFormat:MLXRT_MEDIA_ENCODED width:0 height:0 bytesPerRow:0]);
}

+ (instancetype)imageWithPixels:(NSData *)pixels
                          width:(NSUInteger)width
                         height:(NSUInteger)height
                    bytesPerRow:(NSUInteger)bytesPerRow
                         format:(MLXRTPixelFormat)format {
    return MLXRT_AUTORELEASE([[self alloc] initWithData:pixels
                                            pixelFormat:format
                                                  width:width
                                                 height:height
                                            bytesPerRow:bytesPerRow]);
}

- (instancetype)initWithData:(NSData *)data
                 pixelFormat:(NSInteger)format
                       width:(NSUInteger)width
                      height:(NSUInteger)height
                 bytesPerRow:(NSUInteger)bytesPerRow {
    if ((self = [super init])) {
        _data = [data copy];  // an immutable NSData is retained, not copied
        _pixelFormat = format;
        _width = width;
        _height = height;
        _bytesPerRow = bytesPerRow;
    }
    return self;
}

MLXRT_IMMUTABLE_COPY

/// The C entry: points into `data`, valid while this object lives.
- (mlxrt_media)media {
    mlxrt_media m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.kind = MLXRT_MEDIA_IMAGE;
    m.format = (int32_t)_pixelFormat;
    // Out-of-range sizes become values mlxrt refuses rather than wrapping.
    m.width = _width > UINT32_MAX ? UINT32_MAX : (uint32_t)_width;
    m.height = _height > UINT32_MAX ? UINT32_MAX : (uint32_t)_height;
    m.stride = _bytesPerRow;
    m.bytes = _data.bytes;
    m.n_bytes = _data.length;
    return m;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_data release];
    [super dealloc];
}
#endif
@end

@interface MLXRTAudio ()
- (instancetype)initWithData:(NSData *)data sampleRate:(NSUInteger)sampleRate;
- (mlxrt_media)media;
@end

@implementation MLXRTAudio
@synthesize data = _data, sampleRate = _sampleRate;

+ (instancetype)audioWithData:(NSData *)data {
    return MLXRT_AUTORELEASE([[self alloc] initWithData:data sampleRate:0]);
}

+ (instancetype)audioWithSamples:(NSData *)samples sampleRate:(NSUInteger)sampleRate {
    return MLXRT_AUTORELEASE([[self alloc] initWithData:samples sampleRate:sampleRate]);
}

- (instancetype)initWithData:(NSData *)data sampleRate:(NSUInteger)sampleRate {
    if ((self = [super init])) {
        _data = [data copy];
        _sampleRate = sampleRate;
    }
    return self;
}

MLXRT_IMMUTABLE_COPY

/// The C entry: points into `data`, valid while this object lives. Samples
/// at a rate of 0 (or over UINT32_MAX) are refused by mlxrt.
- (mlxrt_media)media {
    mlxrt_media m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.kind = MLXRT_MEDIA_AUDIO;
    BOOL samples = _sampleRate > 0;
    m.format = samples ? MLXRT_AUDIO_F32 : MLXRT_MEDIA_ENCODED;
    m.sample_rate = _sampleRate > UINT32_MAX ? 0 : (uint32_t)_sampleRate;
    m.bytes = _data.bytes;
    m.n_bytes = _data.length;
    return m;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_data release];
    [super dealloc];
}
#endif
@end

@implementation MLXRTMessage
@synthesize role = _role, content = _content, images = _images, audio = _audio;

+ (instancetype)messageWithRole:(NSString *)role content:(NSString *)content {
    return MLXRT_AUTORELEASE([[self alloc] initWithRole:role content:content]);
}
+ (instancetype)systemMessage:(NSString *)content { return [self messageWithRole:@"system" content:content]; }
+ (instancetype)userMessage:(NSString *)content { return [self messageWithRole:@"user" content:content]; }
+ (instancetype)assistantMessage:(NSString *)content { return [self messageWithRole:@"assistant" content:content]; }
+ (instancetype)userMessage:(NSString *)content images:(NSArray<MLXRTImage *> *)images {
    return MLXRT_AUTORELEASE([[self alloc] initWithRole:@"user" content:content images:images audio:@[]]);
}
+ (instancetype)userMessage:(NSString *)content images:(NSArray<MLXRTImage *> *)images audio:(NSArray<MLXRTAudio *> *)audio {
    return MLXRT_AUTORELEASE([[self alloc] initWithRole:@"user" content:content images:images audio:audio]);
}

- (instancetype)initWithRole:(NSString *)role
                     content:(NSString *)content
                      images:(NSArray<MLXRTImage *> *)images
                       audio:(NSArray<MLXRTAudio *> *)audio {
    if ((self = [super init])) {
        _role = [role copy];
        _content = [content copy];
        _images = [images copy];
        _audio = [audio copy];
    }
    return self;
}

- (instancetype)initWithRole:(NSString *)role content:(NSString *)content images:(NSArray<MLXRTImage *> *)images {
    return [self initWithRole:role content:content images:images audio:@[]];
}

- (instancetype)initWithRole:(NSString *)role content:(NSString *)content {
    return [self initWithRole:role content:content images:@[] audio:@[]];
}

MLXRT_IMMUTABLE_COPY

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_role release];
    [_content release];
    [_images release];
    [_audio release];
    [super dealloc];
}
#endif
@end

@implementation MLXRTRequestParameters
@synthesize messages = _messages, prompt = _prompt, promptTokens = _promptTokens, maxTokens = _maxTokens,
            temperature = _temperature, topP = _topP, topK = _topK, minP = _minP,
            repetitionPenalty = _repetitionPenalty, seed = _seed, stopStrings = _stopStrings,
            optionsJSON = _optionsJSON, cacheNamespace = _cacheNamespace, usesPromptCache = _usesPromptCache,
            thinking = _thinking, logprobs = _logprobs, topLogprobs = _topLogprobs,
            responseFormat = _responseFormat, speculation = _speculation;

- (instancetype)init {
    if ((self = [super init])) {
        mlxrt_request_params p;
        mlxrt_request_params_init(&p);
        _maxTokens = p.max_tokens;
        _temperature = p.temperature;
        _topP = p.top_p;
        _topK = p.top_k;
        _minP = p.min_p;
        _repetitionPenalty = p.repetition_penalty;
        _stopStrings = [[NSArray alloc] init];  // owned: direct ivar access under MRC
        _usesPromptCache = p.no_prompt_cache == 0;
        _thinking = p.thinking;
        _logprobs = p.logprobs != 0;
        _topLogprobs = p.top_logprobs;
    }
    return self;
}

+ (instancetype)parametersWithMessages:(NSArray<MLXRTMessage *> *)messages {
    MLXRTRequestParameters *p = MLXRT_AUTORELEASE([[self alloc] init]);
    p.messages = messages;
    return p;
}

- (id)copyWithZone:(NSZone *)zone {
    MLXRTRequestParameters *p = [[[self class] allocWithZone:zone] init];
    p.messages = _messages;
    p.prompt = _prompt;
    p.promptTokens = _promptTokens;
    p.maxTokens = _maxTokens;
    p.temperature = _temperature;
    p.topP = _topP;
    p.topK = _topK;
    p.minP = _minP;
    p.repetitionPenalty = _repetitionPenalty;
    p.seed = _seed;
    p.stopStrings = _stopStrings;
    p.optionsJSON = _optionsJSON;
    p.cacheNamespace = _cacheNamespace;
    p.usesPromptCache = _usesPromptCache;
    p.thinking = _thinking;
    p.logprobs = _logprobs;
    p.topLogprobs = _topLogprobs;
    p.responseFormat = _responseFormat;
    p.speculation = _speculation;
    return p;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_messages release];
    [_prompt release];
    [_promptTokens release];
    [_seed release];
    [_stopStrings release];
    [_optionsJSON release];
    [_cacheNamespace release];
    [_responseFormat release];
    [_speculation release];
    [super dealloc];
}
#endif
@end

// ---- events ----

@interface MLXRTUsage ()
- (instancetype)initWithUsage:(const mlxrt_usage *)u;
@end

@implementation MLXRTUsage
@synthesize promptTokens = _promptTokens, cachedTokens = _cachedTokens, completionTokens = _completionTokens,
            timeToFirstToken = _timeToFirstToken, prefillTime = _prefillTime, decodeTime = _decodeTime,
            prefillTokensPerSecond = _prefillTokensPerSecond, decodeTokensPerSecond = _decodeTokensPerSecond;
- (instancetype)initWithUsage:(const mlxrt_usage *)u {
    if ((self = [super init])) {
        _promptTokens = u->prompt_tokens;
        _cachedTokens = u->cached_tokens;
        _completionTokens = u->completion_tokens;
        _timeToFirstToken = u->ttft_ms / 1000.0;
        _prefillTime = u->prefill_ms / 1000.0;
        _decodeTime = u->decode_ms / 1000.0;
        _prefillTokensPerSecond = u->prefill_tokens_per_s;
        _decodeTokensPerSecond = u->decode_tokens_per_s;
    }
    return self;
}
@end

@interface MLXRTTokenLogprob ()
- (instancetype)initWithToken:(uint32_t)token logprob:(float)logprob top:(NSArray<MLXRTTokenLogprob *> *)top;
@end

@implementation MLXRTTokenLogprob
@synthesize tokenID = _tokenID, logprob = _logprob, topAlternatives = _topAlternatives;
- (instancetype)initWithToken:(uint32_t)token logprob:(float)logprob top:(NSArray<MLXRTTokenLogprob *> *)top {
    if ((self = [super init])) {
        _tokenID = token;
        _logprob = logprob;
        _topAlternatives = [top copy];
    }
    return self;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_topAlternatives release];
    [super dealloc];
}
#endif
@end

/// An event's log-probabilities as objects (autoreleased).
static NSArray<MLXRTTokenLogprob *> *logprobs_from_c(const mlxrt_token_logprob *lps, size_t n) {
    NSMutableArray<MLXRTTokenLogprob *> *out = [NSMutableArray arrayWithCapacity:n];
    for (size_t i = 0; i < n; i++) {
        NSMutableArray<MLXRTTokenLogprob *> *top = [NSMutableArray arrayWithCapacity:lps[i].n_top];
        for (size_t j = 0; j < lps[i].n_top; j++) {
            MLXRTTokenLogprob *alt = [[MLXRTTokenLogprob alloc] initWithToken:lps[i].top[j].token
                                                                      logprob:lps[i].top[j].logprob
                                                                          top:@[]];
            [top addObject:alt];
            MLXRT_RELEASE(alt);
        }
        MLXRTTokenLogprob *lp = [[MLXRTTokenLogprob alloc] initWithToken:lps[i].token logprob:lps[i].logprob top:top];
        [out addObject:lp];
        MLXRT_RELEASE(lp);
    }
    return out;
}

@interface MLXRTEvent ()
- (instancetype)initWithEvent:(const mlxrt_event *)ev;
@end

@implementation MLXRTEvent
@synthesize kind = _kind, requestID = _requestID, text = _text, tokenIDs = _tokenIDs,
            finishReason = _finishReason, stopIndex = _stopIndex, usage = _usage, error = _error,
            channel = _channel, toolCallID = _toolCallID, toolName = _toolName, toolArguments = _toolArguments,
            logprobs = _logprobs;
/// Copies everything: the C event is only valid during the callback.
- (instancetype)initWithEvent:(const mlxrt_event *)ev {
    if ((self = [super init])) {
        _kind = (MLXRTEventKind)ev->kind;
        _requestID = ev->request_id;
        _text = [[NSString alloc] initWithBytes:ev->text length:ev->text_len encoding:NSUTF8StringEncoding];
        if (!_text) _text = @"";  // never happens: deltas are complete UTF-8
        _tokenIDs = [ids_from_c(ev->tokens, ev->n_tokens) copy];
        _logprobs = [logprobs_from_c(ev->logprobs, ev->n_logprobs) copy];
        _finishReason = (MLXRTFinishReason)ev->finish_reason;
        _stopIndex = ev->stop_index >= 0 ? (NSInteger)ev->stop_index : NSNotFound;
        _channel = (MLXRTChannel)ev->channel;
        if (ev->kind == MLXRT_EVENT_KIND_TOOL_CALL) {
            _toolCallID = [string_from_c(ev->tool_call_id) copy];
            _toolName = [string_from_c(ev->tool_name) copy];
            _toolArguments = [string_from_c(ev->tool_arguments) copy];
        }
        if (ev->kind == MLXRT_EVENT_KIND_DONE) _usage = [[MLXRTUsage alloc] initWithUsage:&ev->usage];
        if (ev->kind == MLXRT_EVENT_KIND_ERROR) {
#if __has_feature(objc_arc)
            _error = error_with(ev->error_status, string_from_c(ev->error_message));
#else
            _error = [error_with(ev->error_status, string_from_c(ev->error_message)) retain];
#endif
        }
    }
    return self;
}

- (BOOL)isFinal {
    return _kind == MLXRTEventKindDone || _kind == MLXRTEventKindError;
}

- (NSString *)description {
    return [NSString stringWithFormat:@"<MLXRTEvent %llu kind=%ld text=%@ finish=%ld error=%@>",
                                      (unsigned long long)_requestID, (long)_kind, _text, (long)_finishReason, _error];
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_text release];
    [_tokenIDs release];
    [_usage release];
    [_error release];
    [_toolCallID release];
    [_toolName release];
    [_toolArguments release];
    [_logprobs release];
    [super dealloc];
}
#endif
@end

// ---- engine facts ----

@interface MLXRTEngineInfo ()
- (instancetype)initWithInfo:(const mlxrt_engine_info *)i;
@end

@implementation MLXRTEngineInfo
@synthesize architecture = _architecture, modelFormat = _modelFormat, device = _device, mlxVersion = _mlxVersion,
            contextLength = _contextLength, vocabSize = _vocabSize, numLayers = _numLayers, hiddenSize = _hiddenSize,
            parameterBytes = _parameterBytes, bosTokenID = _bosTokenID, eosTokenIDs = _eosTokenIDs,
            specialTokenIDs = _specialTokenIDs, hasChatTemplate = _hasChatTemplate, supportsTools = _supportsTools,
            supportsReasoning = _supportsReasoning, modalities = _modalities;
- (instancetype)initWithInfo:(const mlxrt_engine_info *)i {
    if ((self = [super init])) {
        _architecture = [string_from_c(i->architecture) copy];
        _modelFormat = [string_from_c(i->model_format) copy];
        _device = [string_from_c(i->device) copy];
        _mlxVersion = [string_from_c(i->mlx_version) copy];
        _contextLength = i->context_length;
        _vocabSize = i->vocab_size;
        _numLayers = i->num_layers;
        _hiddenSize = i->hidden_size;
        _parameterBytes = i->parameter_bytes;
        _bosTokenID = i->bos_token_id;
        _eosTokenIDs = [ids_from_c(i->eos_token_ids, i->n_eos_token_ids) copy];
        _specialTokenIDs = [ids_from_c(i->special_token_ids, i->n_special_token_ids) copy];
        _hasChatTemplate = i->has_chat_template != 0;
        _supportsTools = i->supports_tools != 0;
        _supportsReasoning = i->supports_reasoning != 0;
        _modalities = i->modalities;
    }
    return self;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_architecture release];
    [_modelFormat release];
    [_device release];
    [_mlxVersion release];
    [_eosTokenIDs release];
    [_specialTokenIDs release];
    [super dealloc];
}
#endif
@end

@interface MLXRTEngineStats ()
- (instancetype)initWithStats:(const mlxrt_engine_stats *)s;
@end

@implementation MLXRTEngineStats
@synthesize queued = _queued, active = _active, inFlight = _inFlight, completed = _completed, kvBytes = _kvBytes,
            kvReserved = _kvReserved, activeMemory = _activeMemory, peakMemory = _peakMemory,
            cacheMemory = _cacheMemory, promptCacheHits = _promptCacheHits, promptCacheMisses = _promptCacheMisses,
            promptCacheHitTokens = _promptCacheHitTokens, promptCacheMemoryBytes = _promptCacheMemoryBytes,
            promptCacheDiskBytes = _promptCacheDiskBytes, encoderCacheBytes = _encoderCacheBytes,
            encoderCacheEntries = _encoderCacheEntries, encoderCacheHits = _encoderCacheHits, towerRuns = _towerRuns;
- (instancetype)initWithStats:(const mlxrt_engine_stats *)s {
    if ((self = [super init])) {
        _queued = s->queued;
        _active = s->active;
        _inFlight = s->in_flight;
        _completed = s->completed;
        _kvBytes = s->kv_bytes;
        _kvReserved = s->kv_reserved;
        _activeMemory = s->active_memory;
        _peakMemory = s->peak_memory;
        _cacheMemory = s->cache_memory;
        _promptCacheHits = s->prompt_cache_hits;
        _promptCacheMisses = s->prompt_cache_misses;
        _promptCacheHitTokens = s->prompt_cache_hit_tokens;
        _promptCacheMemoryBytes = s->prompt_cache_memory_bytes;
        _promptCacheDiskBytes = s->prompt_cache_disk_bytes;
        _encoderCacheBytes = s->encoder_cache_bytes;
        _encoderCacheEntries = s->encoder_cache_entries;
        _encoderCacheHits = s->encoder_cache_hits;
        _towerRuns = s->tower_runs;
    }
    return self;
}
@end

@interface MLXRTRenderedChat ()
- (instancetype)initWithText:(NSString *)text tokenIDs:(NSArray<NSNumber *> *)tokenIDs;
@end

@implementation MLXRTRenderedChat
@synthesize text = _text, tokenIDs = _tokenIDs;
- (instancetype)initWithText:(NSString *)text tokenIDs:(NSArray<NSNumber *> *)tokenIDs {
    if ((self = [super init])) {
        _text = [text copy];
        _tokenIDs = [tokenIDs copy];
    }
    return self;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [_text release];
    [_tokenIDs release];
    [super dealloc];
}
#endif
@end

// ---- delivery: from the engine's delivery thread to the caller's queue ----

/// A request's user_data: the handler and its queue. Owned by the C library
/// from a successful submit until user_data_free (after the last event).
@interface MLXRTDelivery : NSObject {
  @public
    MLXRTEventHandler _handler;
    dispatch_queue_t _queue;
}
@end

@implementation MLXRTDelivery
#if !__has_feature(objc_arc)
- (void)dealloc {
    Block_release(_handler);
    dispatch_release(_queue);
    [super dealloc];
}
#endif
@end

/// Runs on the engine's delivery thread (a thread Foundation did not make):
/// copies the event into an object and hands it to the caller's queue.
static void deliver(void *user_data, const mlxrt_event *ev) {
#ifdef GNUSTEP
    GSRegisterCurrentThread();  // Foundation on a foreign thread; a no-op after the first time
#endif
    @autoreleasepool {
#if __has_feature(objc_arc)
        MLXRTDelivery *d = (__bridge MLXRTDelivery *)user_data;
#else
        MLXRTDelivery *d = (MLXRTDelivery *)user_data;
#endif
        MLXRTEvent *event = [[MLXRTEvent alloc] initWithEvent:ev];
        // The block owns its own references to the event and the handler:
        // user_data may be freed before it runs, and the GNU runtime's blocks
        // do not retain captured objects, so under MRC it releases them itself.
        MLXRTEventHandler handler = MLXRT_BLOCK_COPY(d->_handler);
        dispatch_async(d->_queue, ^{
#ifdef GNUSTEP
            GSRegisterCurrentThread();  // a queue's thread may be foreign too
#endif
            @autoreleasepool {
                handler(event);
            }
            MLXRT_RELEASE(event);
            MLXRT_BLOCK_RELEASE(handler);
        });
    }
}

static void free_delivery(void *user_data) {
#if __has_feature(objc_arc)
    MLXRTDelivery *d = (__bridge_transfer MLXRTDelivery *)user_data;
    (void)d;  // released here
#else
    [(MLXRTDelivery *)user_data release];
#endif
}

// ---- requests and the engine ----

#if !MLXRT_FRAGILE_IVARS
@interface MLXRTRequestTask () {
    mlxrt_request *_request;
}
@end
#endif

@interface MLXRTRequestTask ()
- (instancetype)initWithRequest:(mlxrt_request *)request;
@end

@implementation MLXRTRequestTask
@synthesize requestID = _requestID;
- (instancetype)initWithRequest:(mlxrt_request *)request {
    if ((self = [super init])) {
        _request = request;
        _requestID = mlxrt_request_id(request);
    }
    return self;
}

- (void)cancel {
    mlxrt_request_cancel(_request, NULL);  // only fails for NULL
}

- (void)dealloc {
    mlxrt_request_free(_request);  // the handle only; does not cancel
    MLXRT_SUPER_DEALLOC();
}
@end

#if MLXRT_FRAGILE_IVARS
@implementation MLXRTEngine
#else
@implementation MLXRTEngine {
    mlxrt_engine *_engine;
    MLXRTEngineInfo *_info;
}
#endif

+ (NSString *)libraryVersion {
    return string_from_c(mlxrt_version_string());
}

- (instancetype)initWithConfiguration:(MLXRTEngineConfiguration *)configuration error:(NSError **)error {
    if (!(self = [super init])) return nil;
    if (mlxrt_abi_version() != MLXRT_ABI_VERSION) {
        if (error) *error = error_with(MLXRT_STATUS_UNSUPPORTED, @"MLXRT.h was built against another libmlxrt ABI");
        MLXRT_RELEASE(self);
        return nil;
    }
    MLXRTEngineConfiguration *cfg = MLXRT_AUTORELEASE([configuration copy]);
    mlxrt_engine_config c;
    mlxrt_engine_config_init(&c);
    c.model_path = [cfg.modelPath UTF8String];
    c.device = (int32_t)cfg.device;
    c.max_in_flight = (uint32_t)cfg.maxInFlight;
    c.max_rows = (uint32_t)cfg.maxRows;
    c.prefill_chunk = (uint32_t)cfg.prefillChunk;
    c.kv_budget = cfg.kvBudget;
    c.seed = cfg.seed;
    c.prompt_cache_bytes = cfg.promptCacheBytes;
    c.prompt_cache_dir = cfg.promptCacheDirectory ? [cfg.promptCacheDirectory UTF8String] : NULL;
    c.draft_model_path = cfg.draftModelPath ? [cfg.draftModelPath UTF8String] : NULL;
    mlxrt_error *err = NULL;
    mlxrt_status status = mlxrt_engine_create(&c, &_engine, &err);
    // The model's facts never change: read them once.
    mlxrt_engine_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (status == MLXRT_STATUS_OK) status = mlxrt_engine_get_info(_engine, &info, &err);
    if (status != MLXRT_STATUS_OK) {
        take_error(error, status, err);
        MLXRT_RELEASE(self);  // dealloc destroys an engine that was made
        return nil;
    }
    _info = [[MLXRTEngineInfo alloc] initWithInfo:&info];
    return self;
}

- (void)dealloc {
    mlxrt_engine_destroy(_engine);  // cancels, delivers last events, joins
    MLXRT_RELEASE(_info);
    MLXRT_SUPER_DEALLOC();
}

- (MLXRTEngineInfo *)info {
    return _info;
}

- (MLXRTEngineStats *)stats {
    mlxrt_engine_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    mlxrt_engine_get_stats(_engine, &s, NULL);  // only fails for a NULL engine
    return MLXRT_AUTORELEASE([[MLXRTEngineStats alloc] initWithStats:&s]);
}

/// optionsJSON with "response_format" and "speculation" added (text that is
/// not a JSON object is passed on as is: mlxrt reports it).
static NSString *merged_options(NSString *options, NSString *format, NSString *speculation) {
    NSMutableArray<NSString *> *fields = [NSMutableArray array];
    if (format) [fields addObject:[NSString stringWithFormat:@"\"response_format\":%@", format]];
    if (speculation) [fields addObject:[NSString stringWithFormat:@"\"speculation\":%@", speculation]];
    if (fields.count == 0) return options;
    NSString *field = [fields componentsJoinedByString:@","];
    if (!options) return [NSString stringWithFormat:@"{%@}", field];
    NSRange open = [options rangeOfString:@"{"];
    NSRange close = [options rangeOfString:@"}" options:NSBackwardsSearch];
    if (open.location == NSNotFound || close.location == NSNotFound || close.location < open.location) return options;
    NSString *inside = [options substringWithRange:NSMakeRange(open.location + 1, close.location - open.location - 1)];
    BOOL empty = [[inside stringByTrimmingCharactersInSet:[NSCharacterSet whitespaceAndNewlineCharacterSet]] length] == 0;
    return [NSString stringWithFormat:@"%@%@%@%@", [options substringToIndex:close.location], empty ? @"" : @",", field,
                                      [options substringFromIndex:close.location]];
}

/// The messages as the JSON array the C API takes. A message with media
/// has content parts: `{"type": "image", "media": K}` for each image, then
/// `{"type": "audio", "media": K}` for each clip, K counting the media of
/// all messages in order (their `mlxrt_media` entries), then its text.
static NSString *messages_json(NSArray<MLXRTMessage *> *messages, NSError **error) {
    NSMutableArray *list = [NSMutableArray arrayWithCapacity:messages.count];
    NSUInteger k = 0;
    for (MLXRTMessage *m in messages) {
        if (m.images.count == 0 && m.audio.count == 0) {
            [list addObject:@{@"role": m.role, @"content": m.content}];
            continue;
        }
        NSMutableArray *parts = [NSMutableArray arrayWithCapacity:m.images.count + m.audio.count + 1];
        for (NSUInteger i = 0; i < m.images.count; i++) [parts addObject:@{@"type": @"image", @"media": @(k++)}];
        for (NSUInteger i = 0; i < m.audio.count; i++) [parts addObject:@{@"type": @"audio", @"media": @(k++)}];
        [parts addObject:@{@"type": @"text", @"text": m.content}];
        [list addObject:@{@"role": m.role, @"content": parts}];
    }
    NSError *why = nil;
    NSData *data = [NSJSONSerialization dataWithJSONObject:list options:0 error:&why];
    if (!data) {
        if (error) *error = error_with(MLXRT_STATUS_INVALID_ARGUMENT, [NSString stringWithFormat:@"messages: %@", why]);
        return nil;
    }
    return MLXRT_AUTORELEASE([[NSString alloc] initWithData:data encoding:NSUTF8StringEncoding]);
}

- (MLXRTRequestTask *)submitRequestWithParameters:(MLXRTRequestParameters *)parameters
                                            queue:(dispatch_queue_t)queue
                                     eventHandler:(MLXRTEventHandler)handler
                                            error:(NSError **)error {
    MLXRTRequestParameters *p = MLXRT_AUTORELEASE([parameters copy]);
    mlxrt_request_params c;
    mlxrt_request_params_init(&c);
    if (p.messages) {
        NSString *json = messages_json(p.messages, error);
        if (!json) return nil;
        c.messages_json = [json UTF8String];
    }
    c.prompt = p.prompt ? [p.prompt UTF8String] : NULL;
    c.max_tokens = (uint32_t)p.maxTokens;
    c.temperature = p.temperature;
    c.top_p = p.topP;
    c.top_k = (int32_t)p.topK;
    c.min_p = p.minP;
    c.repetition_penalty = p.repetitionPenalty;
    c.use_seed = p.seed != nil;
    c.seed = p.seed ? p.seed.unsignedLongLongValue : 0;
    NSString *options = merged_options(p.optionsJSON, p.responseFormat, p.speculation);
    c.options_json = options ? [options UTF8String] : NULL;
    c.cache_namespace = p.cacheNamespace ? [p.cacheNamespace UTF8String] : NULL;
    c.no_prompt_cache = p.usesPromptCache ? 0 : 1;
    c.thinking = (int32_t)p.thinking;
    c.logprobs = p.logprobs ? 1 : 0;
    c.top_logprobs = (uint32_t)p.topLogprobs;

    // Arrays the C call copies; freed right after it.
    size_t n_tokens = p.promptTokens.count, n_stop = p.stopStrings.count;
    uint32_t *tokens = p.promptTokens ? ids_to_c(p.promptTokens) : NULL;
    const char **stops = calloc(n_stop ? n_stop : 1, sizeof *stops);
    for (size_t i = 0; i < n_stop; i++) stops[i] = [[p.stopStrings objectAtIndex:i] UTF8String];
    c.prompt_tokens = tokens;
    c.n_prompt_tokens = n_tokens;
    c.stop = n_stop ? stops : NULL;
    c.n_stop = n_stop;
    // The media entries point into their NSData, which `p` (a copy of the
    // parameters, with copies of the messages) keeps alive through the call.
    size_t n_media = 0;
    for (MLXRTMessage *m in p.messages) n_media += m.images.count + m.audio.count;
    mlxrt_media *media = calloc(n_media ? n_media : 1, sizeof *media);
    n_media = 0;
    for (MLXRTMessage *m in p.messages) {
        for (MLXRTImage *image in m.images) media[n_media++] = [image media];
        for (MLXRTAudio *clip in m.audio) media[n_media++] = [clip media];
    }
    c.media = n_media ? media : NULL;
    c.n_media = n_media;

    MLXRTDelivery *d = [[MLXRTDelivery alloc] init];
    d->_handler = MLXRT_BLOCK_COPY(handler);
    d->_queue = queue;
    MLXRT_DISPATCH_RETAIN(queue);
#if __has_feature(objc_arc)
    void *user_data = (__bridge_retained void *)d;  // +1 for the C library
#else
    void *user_data = d;  // the +1 from alloc goes to the C library
#endif
    mlxrt_request *request = NULL;
    mlxrt_error *err = NULL;
    mlxrt_status status = mlxrt_request_submit(_engine, &c, deliver, user_data, free_delivery, &request, &err);
    free(tokens);
    free(stops);
    free(media);
    if (status != MLXRT_STATUS_OK) {
        free_delivery(user_data);  // on failure the C library keeps nothing
        take_error(error, status, err);
        return nil;
    }
    return MLXRT_AUTORELEASE([[MLXRTRequestTask alloc] initWithRequest:request]);
}

- (NSArray<NSNumber *> *)tokenize:(NSString *)text parseSpecial:(BOOL)parseSpecial error:(NSError **)error {
    mlxrt_tokens *tokens = NULL;
    mlxrt_error *err = NULL;
    mlxrt_status status = mlxrt_tokenize(_engine, [text UTF8String], parseSpecial ? 1 : 0, &tokens, &err);
    if (status != MLXRT_STATUS_OK) {
        take_error(error, status, err);
        return nil;
    }
    return take_tokens(tokens);
}

- (NSString *)detokenize:(NSArray<NSNumber *> *)tokenIDs skipSpecial:(BOOL)skipSpecial error:(NSError **)error {
    uint32_t *ids = ids_to_c(tokenIDs);
    char *text = NULL;
    mlxrt_error *err = NULL;
    mlxrt_status status = mlxrt_detokenize(_engine, ids, tokenIDs.count, skipSpecial ? 1 : 0, &text, &err);
    free(ids);
    if (status != MLXRT_STATUS_OK) {
        take_error(error, status, err);
        return nil;
    }
    return take_string(text);
}

- (MLXRTRenderedChat *)renderChatWithParameters:(MLXRTRequestParameters *)parameters error:(NSError **)error {
    NSString *messages = nil;
    if (parameters.messages) {
        messages = messages_json(parameters.messages, error);
        if (!messages) return nil;
    }
    char *text = NULL;
    mlxrt_tokens *tokens = NULL;
    mlxrt_error *err = NULL;
    mlxrt_status status = mlxrt_render_chat(_engine, [messages UTF8String], [parameters.optionsJSON UTF8String],
                                            &text, &tokens, &err);
    if (status != MLXRT_STATUS_OK) {
        take_error(error, status, err);
        return nil;
    }
    NSString *rendered = take_string(text);
    return MLXRT_AUTORELEASE([[MLXRTRenderedChat alloc] initWithText:rendered tokenIDs:take_tokens(tokens)]);
}
@end
